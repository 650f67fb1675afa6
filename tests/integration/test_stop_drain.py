"""A stop of a busy MPS container through gpupack-runc (the RuntimeClass handler), as containerd's shim runs
it: `runc kill` (and `delete --force`) first asks the real agent.runtime.nodeserver to end the container's MPS
clients through the daemon, so a busy neighbour on the same server finishes its work; with the drain off the
neighbour fails. The daemon and both CUDA clients are the stand-in (tests/standin/mps_control.py), which
follows the measured table (docs/node-side.md, "MPS as measured", "Lifetimes": a busy client killed breaks the
server's other clients, 4 of 4; ended by terminate_client first, the others finish, 2 of 2). The "real
runtime" is a script: `state` reports the container's init pid, `kill` signals it as runc would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_runtime_handler import NODE, built, spec, the_pod

from agent.metrics import MPS_STOP_DRAINS
from agent.mpsdaemon.drain import ClientLists
from agent.mpsdaemon.mpscontrol import Control
from agent.mpsdaemon.pipedirs import PipeDirs
from agent.runtime.nodeserver import NodeServer
from app.kube.calls import Request

__all__ = ["built"]  # the handler binary, built once per module

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "mps_control.py"
CGROUP2 = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() else None
CGROUP2 = CGROUP2 or (Path("/sys/fs/cgroup") if Path("/sys/fs/cgroup/cgroup.procs").exists() else None)
RUNTIME = """#!/bin/sh
# Stands in for runc: `state` reports the container's init process, `kill` signals it.
for a in "$@"; do last2=$last; last=$a; done
case " $* " in
  *" state "*) printf '{{"id":"%s","pid":%s,"status":"running"}}' "$last" "$(cat "{out}/pid-$last")" ;;
  *" kill "*) kill -"$last" "$(cat "{out}/pid-$last2")" ;;
esac
exit 0
"""

needs_cgroup2 = pytest.mark.skipif(
    os.geteuid() != 0 or CGROUP2 is None, reason="needs root and a cgroup v2 hierarchy (a container's cgroup)"
)


@dataclass
class Node:
    dir: Path
    binary: Path
    out: Path
    bundle: Path
    pipe: Path
    events: list[dict[str, object]]
    drain_timeout_s: float

    def handler(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            cwd=self.bundle,
            timeout=60,
            check=False,
        )

    def env(self) -> dict[str, str]:
        return dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(self.pipe), CUDA_MPS_LOG_DIRECTORY=str(self.dir))

    def control(self, line: str) -> str:
        done = subprocess.run(
            [sys.executable, str(STANDIN)], input=line + "\n", env=self.env(), capture_output=True, text=True,
            timeout=20, check=False,
        )  # fmt: skip
        return done.stdout

    def client(self, work_s: float) -> subprocess.Popen[str]:
        """A stand-in CUDA client with work in flight for `work_s` seconds; its first line is its server."""
        proc = subprocess.Popen(
            [sys.executable, str(STANDIN), "client", "--work", str(work_s)],
            env=self.env(), stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stdout.readline().startswith("server "), "client not served"
        return proc


def start_server(
    node_dir: Path, pipe: Path, drain_timeout_s: float, events: list[dict[str, object]]
) -> NodeServer:
    def send(req: Request) -> dict[str, object]:
        if req.method == "POST" and req.path.endswith("/events"):
            events.append(dict(req.body or {}))
            return {}
        return {"items": [the_pod()]}

    server = NodeServer(
        node_dir / "state" / "agent.sock", NODE, PipeDirs(pipe), send,
        mps_clients=ClientLists(Control(str(STANDIN), pipe, 10)), drain_timeout_s=drain_timeout_s,
    )  # fmt: skip
    server.start()
    return server


@pytest.fixture(params=[5.0, 0.0], ids=["drain", "no-drain"])
def node(request: pytest.FixtureRequest, built: Path) -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="sd-", dir="/tmp"))  # short: unix socket paths
    root.chmod(0o755)
    install, state, out, bundle, pipe = (root / d for d in ("bin", "state", "out", "bundle", "pipe"))
    for d in (install, state, out, bundle):
        d.mkdir()
    binary = install / "gpupack-runc"
    shutil.copy(built, binary)
    runtime = root / "fake-runc"
    runtime.write_text(RUNTIME.format(out=out))
    runtime.chmod(0o755)
    config = {
        "runtime": str(runtime),
        "socket": str(state / "agent.sock"),
        "state_dir": str(state),
        "timeout_s": 10,
    }
    (install / "gpupack-runc.json").write_text(json.dumps(config))
    events: list[dict[str, object]] = []
    n = Node(root, binary, out, bundle, pipe, events, request.param)
    daemon = subprocess.run(
        [sys.executable, str(STANDIN), "-d", "-M"], env=n.env(), capture_output=True, timeout=20, check=False
    )
    assert daemon.returncode == 0, daemon.stderr
    server = start_server(root, pipe, request.param, events)
    try:
        yield n
    finally:
        server.stop()
        n.control("quit")
        shutil.rmtree(root, ignore_errors=True)


def in_own_cgroup(pid: int, name: str) -> Path:
    """Put `pid` in a cgroup of its own, as a container's processes are."""
    assert CGROUP2 is not None
    group = CGROUP2 / f"gpupack-test-{name}-{os.getpid()}"
    group.mkdir()
    (group / "cgroup.procs").write_text(str(pid))
    return group


def drains() -> dict[str, float]:
    return {o: MPS_STOP_DRAINS.labels(outcome=o)._value.get() for o in ("drained", "off", "incomplete")}


@needs_cgroup2
@pytest.mark.parametrize(
    "stop",
    [("kill", "c1", "15"), ("kill", "c1", "9"), ("delete", "--force", "c1")],
    ids=["sigterm", "sigkill", "delete-force"],
)
def test_a_stopped_busy_mps_container_leaves_its_busy_neighbour_working_only_when_drained(
    node: Node, stop: tuple[str, str, str]
) -> None:
    (node.bundle / "config.json").write_text(json.dumps(spec()))
    made = node.handler("--root", "/run/x", "create", "--bundle", str(node.bundle), "c1")
    assert made.returncode == 0, made.stderr  # the GPU container got its MPS directory: it is drained at stop
    before = drains()
    victim = node.client(work_s=60)
    group = in_own_cgroup(victim.pid, "victim")
    neighbour = node.client(work_s=4)  # another pod's busy client on the same server
    try:
        (node.out / "pid-c1").write_text(str(victim.pid))
        stopped = node.handler("--root", "/run/x", *stop)
        assert stopped.returncode == 0, stopped.stderr
        if stop[0] == "delete":  # the stand-in runtime's delete signals nothing: runc's would kill it now
            victim.kill()
        victim.wait(20)
        out, _ = neighbour.communicate(timeout=30)
    finally:
        for p in (victim, neighbour):
            if p.poll() is None:
                p.kill()
                p.wait(10)
        group.rmdir()
    after = drains()
    if node.drain_timeout_s == 0:
        assert neighbour.returncode == 1 and "cudaErrorIllegalAddress" in out, out
        assert after["off"] == before["off"] + 1
    else:
        assert neighbour.returncode == 0 and out.strip().endswith("done"), out
        assert after["drained"] == before["drained"] + 1
        assert node.events == []  # a complete drain tells nobody


@needs_cgroup2
def test_a_drain_the_daemon_cannot_finish_stops_anyway_and_tells_the_pod(node: Node) -> None:
    """The daemon gone mid-life (its pod restarting): the stop is not held back, and the pod's Event says
    that its GPU neighbours may have failed."""
    if node.drain_timeout_s == 0:
        pytest.skip("about the drain")
    (node.bundle / "config.json").write_text(json.dumps(spec()))
    assert node.handler("--root", "/run/x", "create", "--bundle", str(node.bundle), "c1").returncode == 0
    victim = node.client(work_s=60)
    group = in_own_cgroup(victim.pid, "victim")
    try:
        (node.out / "pid-c1").write_text(str(victim.pid))
        node.control("quit")
        stopped = node.handler("--root", "/run/x", "kill", "c1", "9")
        assert stopped.returncode == 0, stopped.stderr  # the stop went on
        assert victim.wait(20) != 0
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(10)
        group.rmdir()
    (event,) = node.events
    assert event["reason"] == "GPUStopNotDrained" and event["type"] == "Warning"
    assert "stopped before its MPS clients" in str(event["message"])
    assert "was stopped before its MPS clients" in stopped.stderr
