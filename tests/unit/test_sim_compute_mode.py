"""The simulated GPU's compute mode as a CUDA process meets it (docs/node-side.md, "MPS as measured", the
"Compute mode" rows, H100, driver 580): with EXCLUSIVE_PROCESS set and an MPS server running, a plain
(non-MPS) process is refused with CUDA_ERROR_DEVICE_UNAVAILABLE while the server's clients run; with the
daemon up but no server yet, a plain process takes the GPU, and a second one is refused; after `quit`, a
plain process gets the GPU again.

Real processes throughout: the stand-in MPS daemon (tests/standin/mps_control.py), the stand-in CUDA process
(tests/standin/gpu_alloc.py, an MPS client wherever its CUDA_MPS_PIPE_DIRECTORY has a live daemon) and the
agent's simulated allocator, which asks the daemon which pids are its clients
(agent.simgpu.simalloc.mps_view).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.mpsdaemon.mpscontrol import Control
from agent.nvml.base import ComputeMode
from agent.simgpu.simalloc import Allocator, mps_view
from agent.simgpu.simulated import SimulatedNvml

STANDINS = Path(__file__).resolve().parents[1] / "standin"
DAEMON = STANDINS / "mps_control.py"
CUDA_PROCESS = STANDINS / "gpu_alloc.py"
REFUSED = "refused CUDA_ERROR_DEVICE_UNAVAILABLE"


class Node:
    """One simulated GPU, its allocator, and the node's MPS pipe directory (no daemon until started)."""

    def __init__(self, where: Path, mode: ComputeMode) -> None:
        self.where = where
        self.pipe = where / "pipe"
        (where / "gpus.yaml").write_text("gpus:\n  - model: A100-40GB\n")
        self.nvml = SimulatedNvml(where / "gpus.yaml", "n1", state_dir=where / "driver", privileged=True)
        self.nvml.init()
        self.nvml.set_compute_mode(0, mode)
        self.uuid = self.nvml.uuid(0)
        control = Control(str(DAEMON), self.pipe, timeout_s=20)
        self.allocator = Allocator(
            self.nvml, where / "alloc.sock", Path("/proc"), "/sys/fs/cgroup", mps=lambda: mps_view(control)
        )
        self.held: list[subprocess.Popen[str]] = []

    def env(self, mps: bool) -> dict[str, str]:
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(self.pipe), CUDA_MPS_LOG_DIRECTORY=str(self.where))
        if not mps:
            env.pop("CUDA_MPS_PIPE_DIRECTORY")  # a process that dropped (or never had) the pipe directory
        return env

    def daemon(self, command: str) -> str:
        done = subprocess.run(
            [sys.executable, str(DAEMON)], input=command + "\n", env=self.env(True), capture_output=True,
            text=True, timeout=20, check=False,
        )  # fmt: skip
        return done.stdout.strip()

    def start_daemon(self) -> None:
        argv = [sys.executable, str(DAEMON), "-d", "-M"]
        done = subprocess.run(argv, env=self.env(True), capture_output=True, timeout=20, check=False)
        assert done.returncode == 0, done.stderr

    def stop_daemon(self) -> None:
        self.daemon("quit")
        deadline = time.monotonic() + 5
        while (self.pipe / "control").exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def alloc(self, *, mps: bool, hold: bool = False) -> str:
        """A CUDA process's first allocation on the GPU (its context), as it answered; `hold`: it keeps
        its context until the test ends."""
        argv = [sys.executable, str(CUDA_PROCESS), "--socket", str(self.where / "alloc.sock")]
        argv += ["--hold"] if hold else []
        argv += [f"alloc {self.uuid} 100"]
        proc = subprocess.Popen(argv, env=self.env(mps), stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        answer = proc.stdout.readline().rstrip().split(": ", 1)[-1]
        if hold and answer.startswith("ok"):
            self.held.append(proc)
        else:
            proc.kill()
            proc.wait(10)
        return answer

    def close(self) -> None:
        for proc in self.held:
            proc.kill()
            proc.wait(10)
        self.stop_daemon()
        self.allocator.stop()


@pytest.fixture
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    # A short path: the daemon's sockets live under it (a unix socket path has at most 107 bytes).
    where = Path(tmp_path_factory.mktemp("cm", numbered=True))
    n = Node(where, ComputeMode.EXCLUSIVE_PROCESS)
    n.allocator.start()
    yield n
    n.close()


def test_a_plain_process_is_refused_while_a_server_runs_and_mps_clients_are_served(node: Node) -> None:
    node.start_daemon()
    node.daemon("start_server -uid 0")  # what the agent does once the daemon's defaults hold
    (server,) = node.daemon("get_server_list").split()
    assert node.daemon(f"get_client_list {server}") == ""  # no MPS client has come yet
    assert node.alloc(mps=False).startswith(REFUSED)
    assert node.alloc(mps=True, hold=True) == "ok used=104857600"
    assert node.alloc(mps=True) == "ok used=209715200"  # clients share the GPU
    assert node.alloc(mps=False).startswith(REFUSED)


def test_with_the_daemon_up_but_no_server_a_plain_process_takes_the_gpu(node: Node) -> None:
    node.start_daemon()
    assert node.daemon("get_server_list") == ""
    assert node.alloc(mps=False, hold=True) == "ok used=104857600"
    second = node.alloc(mps=False)
    assert second.startswith(REFUSED) and "holds it" in second  # the first one has it to itself


def test_after_quit_a_plain_process_gets_the_gpu_again(node: Node) -> None:
    node.start_daemon()
    node.daemon("start_server -uid 0")
    assert node.alloc(mps=False).startswith(REFUSED)
    node.stop_daemon()
    assert node.alloc(mps=False) == "ok used=104857600"


def test_in_default_mode_a_plain_process_runs_beside_mps_clients(node: Node) -> None:
    node.nvml.set_compute_mode(0, ComputeMode.DEFAULT)
    node.start_daemon()
    node.daemon("start_server -uid 0")
    assert node.alloc(mps=True, hold=True).startswith("ok")
    assert node.alloc(mps=False).startswith("ok")
