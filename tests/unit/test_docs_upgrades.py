"""What docs/upgrades.md and docs/node-side.md say about restarts, readiness and the shipped MPS defaults
is what the code and the chart do: each statement checked here is produced from the code (the agent against
the stand-in MPS daemon, tests/standin/mps_control.py) or read from the chart's values, then looked up in
the docs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent.mpsdaemon.mps import Device, MpsConfig, MpsSupervisor
from agent.mpsdaemon.pipedirs import PipeDirs

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests/standin/mps_control.py"
UPGRADES = " ".join((REPO / "docs/upgrades.md").read_text().split())
NODE_SIDE = " ".join((REPO / "docs/node-side.md").read_text().split())
VALUES = yaml.safe_load((REPO / "deploy/helm/gpupack/values.yaml").read_text())
DEVS = [Device("GPU-a", 40960)]


@pytest.fixture
def pipe() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="docs-up-", dir="/tmp"))  # short: unix socket paths
    yield root / "pipe"
    control(root / "pipe", "quit")
    subprocess.run(["rm", "-rf", str(root)], check=False)


def control(pipe: Path, command: str) -> str:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(pipe))
    done = subprocess.run(
        [sys.executable, str(STANDIN)], input=command + "\n", env=env, capture_output=True, text=True,
        timeout=20, check=False,
    )  # fmt: skip
    return done.stdout.strip()


def start_daemon(pipe: Path) -> None:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(pipe))
    done = subprocess.run(
        [sys.executable, str(STANDIN), "-d", "-M"], env=env, capture_output=True, timeout=20, check=False
    )
    assert done.returncode == 0, done.stderr


def test_new_defaults_reach_clients_only_with_a_new_daemon_pod(pipe: Path) -> None:
    """An agent with new defaults sets them on the running daemon, but keeps the server it (or an earlier
    agent) pre-started: NVIDIA documents a changed default as reaching only the next server. The docs must say
    so, not that new defaults need no daemon restart."""
    start_daemon(pipe)
    first = MpsSupervisor(MpsConfig(binary=str(STANDIN), pipe_dir=pipe, command_timeout_s=20))
    assert first.tick(DEVS, 0.0).state == "running"
    (server,) = control(pipe, "get_server_list").split()
    upgraded = MpsConfig(
        binary=str(STANDIN), pipe_dir=pipe, default_thread_percentage=50, command_timeout_s=20
    )
    status = MpsSupervisor(upgraded).tick(DEVS, 0.0)
    assert status.state == "running"
    # The GPUNode's words, as the docs quote them (the server's pid as <pid>, the rest after ":" elided).
    quoted = status.message.replace(server, "<pid>").split(": ")[0] + ": …"
    assert f"`{quoted}`" in UPGRADES, quoted
    assert control(pipe, "get_default_active_thread_percentage").split()[-1] in ("50", "50.0")
    assert control(pipe, "get_server_list").split() == [server]  # the running server is kept
    assert "will only affect the next server" in UPGRADES
    assert "new defaults reach MPS clients once the node's daemon pod has been replaced" in UPGRADES
    assert "need no daemon restart" not in UPGRADES


def test_after_a_daemon_restart_the_agent_renews_running_pods_links(pipe: Path) -> None:
    """The docs list the link renewal among what gpupack does to a running container; the agent does it as
    soon as it has configured the new daemon."""
    start_daemon(pipe)
    dirs = PipeDirs(pipe)
    sup = MpsSupervisor(MpsConfig(binary=str(STANDIN), pipe_dir=pipe, command_timeout_s=20))
    sup.on_new_daemon(dirs.refresh)
    assert sup.tick(DEVS, 0.0).state == "running"
    pod_dir = dirs.ensure("uid-1")
    assert isinstance(pod_dir, Path)
    control(pipe, "quit")
    deadline = time.monotonic() + 5
    while (pipe / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    start_daemon(pipe)
    assert os.stat(pod_dir / "control").st_ino != os.stat(pipe / "control").st_ino  # a stale link now
    assert sup.tick(DEVS, 5.0).state == "running"
    assert os.stat(pod_dir / "control").st_ino == os.stat(pipe / "control").st_ino
    assert "the agent renews the link in its MPS directory after an MPS daemon restart" in UPGRADES
    assert "Nothing of gpupack sits in a running container's path" not in UPGRADES


def test_the_shipped_mps_defaults_are_what_the_docs_say() -> None:
    """Closed by default: EXCLUSIVE_PROCESS with a multi-user daemon (whose server the agent pre-starts)."""
    mps = VALUES["agent"]["mps"]
    assert mps["exclusiveProcess"] is True and mps["multiUser"] is True
    assert MpsConfig().prestart_server is True
    assert "With `agent.mps.exclusiveProcess: true`, **the default**" in NODE_SIDE
    assert "`agent.mps.exclusiveProcess: true`, now the default," in UPGRADES
    assert "defaults to **off**" not in NODE_SIDE and "defaults to off" not in UPGRADES
