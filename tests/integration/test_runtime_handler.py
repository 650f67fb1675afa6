"""gpupack-runc (handler/, the RuntimeClass handler) run as containerd's shim runs it, answered by the real
agent.runtime.nodeserver on a unix socket; the "real runtime" it hands over to is a script that records what
it got. What the handler must do: edit only `create` of a Kubernetes container, from the agent's answer,
before the runtime runs; refuse (exit 1, the reason in runc's JSON log) when the agent cannot answer or says
no."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.mpsdaemon import mpsprep
from agent.mpsdaemon.pipedirs import PipeDirs
from agent.nvml.base import ComputeMode
from agent.runtime.nodeserver import NodeServer
from app.core import names
from app.core.errors import KubeError
from app.core.model import Allocation
from app.kube.calls import Request

REPO = Path(__file__).resolve().parents[2]
NODE = "gpu-1"
UID = "5d0c2d4e-aaaa-bbbb-cccc-0123456789ab"
FAKE_RUNTIME = """#!/bin/sh
# Stands in for runc: records its arguments and the spec it would create the container from.
printf '%s\\n' "$@" > "{out}/argv"
[ -f "{bundle}/config.json" ] && cp "{bundle}/config.json" "{out}/seen.json"
exit 0
"""


def the_pod() -> dict[str, Any]:
    alloc = Allocation(node=NODE, gpu_indexes=(0,), gpu_uuids=("GPU-a",), milli=500, memory_mib=20480)
    return {
        "metadata": {"uid": UID, "namespace": "team-a", "name": "half",
                     "labels": {names.LABEL_MANAGED: "true"},
                     "annotations": {names.GPU_FRACTION: "0.5", **alloc.to_annotations()}},
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}, {"name": "side"}]},
    }  # fmt: skip


def spec(kind: str = "container", container: str = "main", **extra: Any) -> dict[str, Any]:
    annotations = {
        "io.kubernetes.cri.container-type": kind,
        "io.kubernetes.cri.sandbox-uid": UID,
        "io.kubernetes.cri.sandbox-name": "half",
        "io.kubernetes.cri.sandbox-namespace": "team-a",
    }
    if kind == "container":
        annotations["io.kubernetes.cri.container-name"] = container
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "user": {"uid": 1000, "gid": 1000},
            "args": ["sh"],
            "env": ["PATH=/bin", "CUDA_VISIBLE_DEVICES=GPU-mine", "NVIDIA_GPU_MEMORY_LIMIT=80G"],
        },
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "annotations": annotations,
        "linux": {"cgroupsPath": "/kubepods/besteffort/pod" + UID + "/abc"},
        **extra,
    }  # fmt: skip


@dataclass
class Node:
    """One node's worth of handler: its install dir, the agent's socket, a stand-in MPS daemon socket."""

    dir: Path
    binary: Path
    state: Path
    pipe: Path
    out: Path
    bundle: Path
    server: NodeServer
    daemon: socket.socket | None

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            cwd=self.bundle,
            timeout=30,
            check=False,
        )

    def create(self, doc: dict[str, Any], cid: str = "c1") -> subprocess.CompletedProcess[str]:
        (self.bundle / "config.json").write_text(json.dumps(doc))
        for f in ("argv", "seen.json"):
            (self.out / f).unlink(missing_ok=True)
        log, pid = str(self.out / "log.json"), str(self.out / "pid")
        return self.run("--root", "/run/x", "--log", log, "--log-format", "json",
                        "create", "--bundle", str(self.bundle), "--pid-file", pid, cid)  # fmt: skip

    def argv(self) -> list[str]:
        return (self.out / "argv").read_text().splitlines()

    def seen(self) -> dict[str, Any]:
        return json.loads((self.out / "seen.json").read_text())

    def record(self, cid: str) -> dict[str, Any]:
        return json.loads((self.state / "containers" / f"{cid}.json").read_text())

    def log_errors(self) -> list[str]:
        lines = (self.out / "log.json").read_text().splitlines()
        return [e["msg"] for e in map(json.loads, lines) if e["level"] == "error"]


@pytest.fixture(scope="module")
def built() -> Path:
    done = subprocess.run([str(REPO / "handler/build.sh")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def node(built: Path) -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="gh-", dir="/tmp"))  # short: unix socket paths are at most 107 bytes
    install, state, pipe, out, bundle = (root / d for d in ("bin", "state", "pipe", "out", "bundle"))
    for d in (install, state, pipe, out, bundle):
        d.mkdir()
    binary = install / "gpupack-runc"
    shutil.copy(built, binary)
    runtime = root / "fake-runc"
    runtime.write_text(FAKE_RUNTIME.format(out=out, bundle=bundle))
    runtime.chmod(0o755)
    sock = state / "agent.sock"
    config = {"runtime": str(runtime), "socket": str(sock), "state_dir": str(state), "timeout_s": 5}
    (install / "gpupack-runc.json").write_text(json.dumps(config))

    def send(req: Request) -> dict[str, Any]:
        if req.method == "GET" and req.path == "/api/v1/namespaces/team-a/pods":
            # The pod by name, fresh (this node server has no watch of the node's pods).
            assert req.query == {"fieldSelector": "metadata.name=half"}
            return {"items": [the_pod()]}
        if req.method == "GET" and req.path == "/api/v1/pods":
            return {"items": [the_pod()]}
        raise KubeError(404, "NotFound", f"{req.path} not found")

    daemon = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # the MPS control daemon's socket type
    daemon.bind(str(pipe / "control"))
    daemon.listen(8)
    server = NodeServer(sock, NODE, PipeDirs(pipe), send)
    server.start()
    n = Node(root, binary, state, pipe, out, bundle, server, daemon)
    try:
        yield n
    finally:
        n.server.stop()
        daemon.close()
        shutil.rmtree(root)


def env_of(doc: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in doc["process"]["env"])


def test_gpu_container_create_gets_its_share_before_the_runtime_runs(node: Node) -> None:
    done = node.create(spec(), "c1")
    assert done.returncode == 0, done.stderr
    args = ["--root", "/run/x", "--log", str(node.out / "log.json"), "--log-format", "json", "create",
            "--bundle", str(node.bundle), "--pid-file", str(node.out / "pid"), "c1"]  # fmt: skip
    assert node.argv() == args  # the runtime got the command line unchanged
    seen = node.seen()
    env = env_of(seen)
    assert env[names.ENV_CUDA_VISIBLE_DEVICES] == "GPU-a"  # the user's value replaced by the allocation's
    assert env[names.ENV_MPS_THREAD_PERCENTAGE] == "50"
    assert env[names.ENV_MPS_PIPE_DIRECTORY] == names.MPS_PIPE_DIRECTORY
    assert env["PATH"] == "/bin"
    assert "NVIDIA_GPU_MEMORY_LIMIT" not in env  # NVIDIA's hook sets no second limit
    mounts = {m["destination"]: m for m in seen["mounts"]}
    pod_dir = node.pipe / "pods" / UID
    assert mounts[names.MPS_PIPE_DIRECTORY] == {
        "destination": names.MPS_PIPE_DIRECTORY,
        "type": "bind",
        "source": str(pod_dir),
        "options": ["rbind", "rw", "nosuid", "nodev"],
    }
    assert [p.name for p in pod_dir.iterdir()] == ["control"]  # its own directory: the daemon's socket only
    record_mount = mounts["/run/gpupack/injection.json"]
    assert record_mount["source"] == str(node.state / "containers" / "c1.json")
    assert "ro" in record_mount["options"]
    assert seen["process"]["user"] == {"uid": 1000, "gid": 1000}  # the rest of the spec as it was
    assert seen["linux"] == spec()["linux"]
    record = node.record("c1")
    assert record["container_id"] == "c1" and record["pod_uid"] == UID and record["container"] == "main"
    assert record["env"] == {k: env[k] for k in record["env"]}
    with open("/proc/uptime") as f:
        now_boot_ns = float(f.read().split()[0]) * 1e9
    assert 0 < record["boottime_ns"] <= now_boot_ns + 1e7  # read before the runtime ran, on the boot clock


def test_other_container_of_the_pod_gets_no_gpu_and_no_mps(node: Node) -> None:
    assert node.create(spec(container="side"), "c2").returncode == 0
    seen = node.seen()
    assert env_of(seen)[names.ENV_NVIDIA_VISIBLE_DEVICES] == "void"
    assert names.MPS_PIPE_DIRECTORY not in {m["destination"] for m in seen["mounts"]}


def test_sandbox_and_non_kubernetes_containers_pass_unchanged(node: Node) -> None:
    sandbox = spec("sandbox")
    assert node.create(sandbox, "s1").returncode == 0
    assert node.seen() == sandbox
    assert node.record("s1")["kind"] == "sandbox"  # counted as in use until deleted
    plain = spec()
    del plain["annotations"]
    assert node.create(plain, "p1").returncode == 0
    assert node.seen() == plain


def test_agent_down_fails_create_with_the_reason_where_the_shim_reads_it(node: Node) -> None:
    node.server.stop()
    done = node.create(spec(), "c3")
    assert done.returncode == 1
    assert not (node.out / "argv").exists()  # the runtime never ran: no container
    (error,) = node.log_errors()
    where = 'gpupack: container "main" of pod team-a/half not started'
    assert error.startswith(f"{where}: the gpupack agent on this node did not answer")
    assert error in done.stderr
    assert not (node.state / "containers" / "c3.json").exists()


def test_backend_down_fails_create_with_the_reason(node: Node) -> None:
    assert node.daemon is not None
    node.daemon.close()
    done = node.create(spec(), "c4")
    assert done.returncode == 1
    (error,) = node.log_errors()
    assert "not started: the MPS control daemon does not answer at" in error
    assert not (node.out / "argv").exists()


def test_no_ready_record_of_this_boot_fails_create_until_the_daemon_pod_writes_it(node: Node) -> None:
    """The agent as agent.main wires it: the MPS daemon pod's ready record (agent.mpsdaemon.mpsprep) is
    checked."""
    node.server.stop()
    boot = mpsprep.boot_id()

    def not_ready(uuids: Sequence[str]) -> str:
        return mpsprep.not_ready(node.pipe, list(uuids), ComputeMode.EXCLUSIVE_PROCESS, boot)

    node.server = NodeServer(node.server.socket_path, NODE, PipeDirs(node.pipe), node.server.send,
                             mps_not_ready=not_ready)  # fmt: skip
    node.server.start()
    gpu = mpsprep.GpuMode(0, "GPU-a", ComputeMode.EXCLUSIVE_PROCESS)  # as prepare-mps records it
    for tried, (boot_of_record, said) in enumerate(((None, "missing"), ("an-earlier-boot", "earlier boot"))):
        if boot_of_record is not None:
            mpsprep.write_ready(node.pipe, [gpu], boot_of_record)
        done = node.create(spec(), f"r{tried}")
        assert done.returncode == 1
        errors = node.log_errors()
        assert len(errors) == tried + 1, errors
        error = errors[-1]
        assert 'container "main" of pod team-a/half not started: ' in error
        assert "would be an MPS client too early: the MPS daemon pod has not prepared this node" in error
        assert said in error
        assert not (node.out / "argv").exists()  # the runtime never ran
    mpsprep.write_ready(node.pipe, [gpu], boot)
    assert node.create(spec(), "r9").returncode == 0
    assert env_of(node.seen())[names.ENV_CUDA_VISIBLE_DEVICES] == "GPU-a"


def test_a_mount_of_the_pods_own_where_the_mps_directory_goes_is_refused(node: Node) -> None:
    doc = spec()
    doc["mounts"].append({"destination": names.MPS_PIPE_DIRECTORY, "type": "bind", "source": "/tmp"})
    done = node.create(doc, "c5")
    assert done.returncode == 1
    assert f"the pod already mounts something at {names.MPS_PIPE_DIRECTORY}" in node.log_errors()[0]


def test_every_other_subcommand_passes_through_and_delete_drops_the_record(node: Node) -> None:
    assert node.create(spec(), "c6").returncode == 0
    for args in (["--root", "/run/x", "start", "c6"], ["state", "c6"], ["kill", "c6", "9"], ["--version"]):
        done = node.run(*args)
        assert done.returncode == 0, done.stderr
        assert node.argv() == args
    assert (node.state / "containers" / "c6.json").exists()
    assert node.run("--root", "/run/x", "delete", "--force", "c6").returncode == 0
    assert node.argv() == ["--root", "/run/x", "delete", "--force", "c6"]
    assert not (node.state / "containers" / "c6.json").exists()


def test_run_is_no_way_around_the_node_side(node: Node) -> None:
    (node.bundle / "config.json").write_text(json.dumps(spec()))
    node.server.stop()
    done = node.run("run", "--bundle", str(node.bundle), "c10")
    assert done.returncode == 1 and "did not answer" in done.stderr
    assert not (node.out / "argv").exists()


def test_unconfigured_handler_refuses_create(node: Node) -> None:
    (node.binary.parent / "gpupack-runc.json").unlink()
    done = node.create(spec(), "c7")
    assert done.returncode == 1
    assert "gpupack runtime handler is not configured on this node" in node.log_errors()[0]


def test_a_restarted_container_is_a_new_container_with_its_own_record(node: Node) -> None:
    assert node.create(spec(), "c8").returncode == 0
    assert node.create(spec(), "c9").returncode == 0
    first, second = node.record("c8"), node.record("c9")
    assert (first["container_id"], second["container_id"]) == ("c8", "c9")
    assert first["boottime_ns"] < second["boottime_ns"]
    assert os.path.exists(node.pipe / "pods" / UID / "control")


def v2_root() -> str:
    mounts = Path("/proc/self/mountinfo").read_text()
    return next((ln.split()[4] for ln in mounts.splitlines() if " - cgroup2 " in ln), "")


@pytest.mark.skipif(
    os.geteuid() != 0 or not v2_root(), reason="a cgroup v2 leaf for the container needs root"
)
def test_limits_are_set_by_the_hook_on_the_containers_own_cgroup_and_cleared_by_delete(
    node: Node, tmp_path: Path
) -> None:
    """The handler adds its createRuntime hook; run as runc runs it (the container's state on stdin, its
    process already in its cgroup), it gets the agent to set the limits there, or fails the create."""
    import yaml

    from agent.enforce.limiter import Limiter
    from agent.enforce.memlimits import Capability
    from agent.simgpu.simulated import SimulatedNvml

    root = v2_root()
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(
        yaml.safe_dump({"driver_version": "615.25", "gpus": [{"model": "A100-40GB", "uuid": "GPU-a"}]})
    )
    nvml = SimulatedNvml(gpus, NODE, state_dir=tmp_path / "driver", privileged=True, cgroup_root=root)
    nvml.init()
    send = node.server.send
    node.server.stop()
    node.server = NodeServer(
        node.state / "agent.sock", NODE, PipeDirs(node.pipe), send,
        limiter=Limiter(lambda: nvml, node.state / "limits"), capability=lambda: Capability(True, "", root),
    )  # fmt: skip
    node.server.start()
    leaf = f"/gpupack-hook-{os.getpid()}"
    doc = spec()
    doc["linux"]["cgroupsPath"] = leaf
    assert node.create(doc, "c11").returncode == 0
    (hook,) = node.seen()["hooks"]["createRuntime"]
    assert hook["path"] == str(node.binary) and hook["args"] == [
        str(node.binary),
        "--gpupack-hook",
        "create-runtime",
    ]
    (Path(root) / leaf.lstrip("/")).mkdir()
    container = subprocess.Popen(["sleep", "60"])  # stands in for runc init, waiting in its new cgroup
    try:
        (Path(root) / leaf.lstrip("/") / "cgroup.procs").write_text(str(container.pid))
        state = {"ociVersion": "1.0.2", "id": "c11", "status": "created", "pid": container.pid,
                 "bundle": str(node.bundle), "annotations": doc["annotations"]}  # fmt: skip
        ran = subprocess.run(hook["args"], input=json.dumps(state), capture_output=True, text=True,
                             timeout=30, check=False)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        mib = 1 << 20
        assert nvml.limits.limited("GPU-a")[root + leaf] | {"set_boottime_ns": 0} == {
            "soft": 20480 * mib, "hard": 20480 * mib, "set_boottime_ns": 0,
        }  # fmt: skip
        # The hook for a process that is not in the spec's cgroup fails the create, with the reason.
        stray = dict(state, id="c12", pid=os.getpid())
        ran = subprocess.run(hook["args"], input=json.dumps(stray), capture_output=True, text=True,
                             timeout=30, check=False)  # fmt: skip
        assert ran.returncode == 1 and f"not in the leaf '{leaf}'" in ran.stderr, ran.stderr
        assert 'container "main" of pod team-a/half not started' in ran.stderr
        # runc delete passes through the handler: the limits go first
        assert node.run("--root", "/run/x", "delete", "c11").returncode == 0
        assert nvml.limits.limited("GPU-a") == {}
    finally:
        container.kill()
        container.wait()
        (Path(root) / leaf.lstrip("/")).rmdir()


def test_handler_go_unit_tests_pass() -> None:
    """handler/*_test.go (the guard's decision and its edits of the spec), run by Go's own test runner."""
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "local")}
    done = subprocess.run(
        ["go", "test", "-count=1", "./..."], cwd=REPO / "handler", capture_output=True, text=True, env=env,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_guard_as_installed_voids_a_plain_pod_without_an_agent_and_uninstall_restores_the_runtime(
    built: Path,
) -> None:
    """The installer puts the guard where node preparation linked containerd's default runtime; with no
    agent on the node, a pod with no gpupack allocation whose image says NVIDIA_VISIBLE_DEVICES=all is
    created with `void`, an exempt pod as it asked; uninstall makes the path the previous runtime again."""
    from agent.runtime import handlerinstall as hi

    root = Path(tempfile.mkdtemp(prefix="gg-", dir="/tmp"))
    try:
        install, state, out, bundle = (root / d for d in ("bin", "state", "out", "bundle"))
        for d in (install, state, out, bundle):
            d.mkdir()
        runtime = root / "fake-runc"
        runtime.write_text(FAKE_RUNTIME.format(out=out, bundle=bundle))
        runtime.chmod(0o755)
        (install / hi.GUARD_BINARY).symlink_to(runtime)  # node preparation
        files = hi.GuardFiles(install, state, ("gpu-operator",), ())
        assert hi.install_guard(files, built) == ""

        def create(namespace: str, cid: str) -> dict[str, Any]:
            doc = spec(container="main")
            doc["annotations"]["io.kubernetes.cri.sandbox-namespace"] = namespace
            doc["process"]["env"] = ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]
            (bundle / "config.json").write_text(json.dumps(doc))
            done = subprocess.run(
                [str(files.binary), "--root", "/run/x", "create", "--bundle", str(bundle), cid],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert (out / "argv").read_text().splitlines()[-1] == cid
            seen: dict[str, Any] = json.loads((out / "seen.json").read_text())
            return seen

        plain = create("team-a", "c1")
        assert env_of(plain)["NVIDIA_VISIBLE_DEVICES"] == "void"
        record = json.loads((state / "guarded" / "c1.json").read_text())
        assert (record["namespace"], record["guard"], record["env"]) == (
            "team-a", "no-gpu", {"NVIDIA_VISIBLE_DEVICES": "void"},
        )  # fmt: skip
        assert {"destination": "/run/gpupack/injection.json", "type": "bind",
                "source": str(state / "guarded" / "c1.json"),
                "options": ["rbind", "ro", "nosuid", "nodev"]} in plain["mounts"]  # fmt: skip
        assert env_of(create("gpu-operator", "c2"))["NVIDIA_VISIBLE_DEVICES"] == "all"
        delete = subprocess.run(
            [str(files.binary), "delete", "c1"], capture_output=True, timeout=30, check=False
        )
        assert delete.returncode == 0 and not (state / "guarded" / "c1.json").exists()

        assert hi.uninstall_guard(files)
        assert os.readlink(files.binary) == str(runtime)
        assert env_of(create("team-a", "c3"))["NVIDIA_VISIBLE_DEVICES"] == "all"  # the runtime as before
    finally:
        shutil.rmtree(root)
