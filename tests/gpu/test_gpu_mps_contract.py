"""The measured MPS contract (tests/contract/mps_contract.py) asserted of NVIDIA's own control binary and CUDA
driver: the same checks the stand-in passes in tests/unit/test_mps_contract.py. Clients are cudadrv.py
(driver API through ctypes): `busy` keeps memsets in flight, `alloc` finds what a client can allocate."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from gpuclients import Clients
from gpuhost import REHEARSAL
from gpumps import control

from agent.nvml.base import Nvml
from tests.contract import mps_contract
from tests.contract.mps_contract import Finished

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        REHEARSAL,
        reason="rehearsal: its fake control models none of NVIDIA's lifetimes (the stand-in's own run of "
        "these checks is tests/unit/test_mps_contract.py)",
    ),
]


class RealBusy:
    def __init__(self, driver: Clients, env: Mapping[str, str], seconds: float) -> None:
        self.proc = driver.start("busy", ["--mib", "256", "--seconds", str(seconds)], env)
        ready = driver.ready(self.proc, 60)
        assert ready.get("ready"), ready
        self.pid = self.proc.pid

    def result(self, timeout_s: float) -> Finished:
        done = Clients.finish(self.proc, timeout_s)
        error = str(done.body.get("failure") or done.body.get("cuda_error") or done.body.get("error") or "")
        return Finished(
            done.rc == 0 and bool(done.body.get("done")), error, f"{done.body} {done.stderr[-300:]}"
        )

    def kill(self, sig: int) -> None:
        os.kill(self.pid, sig)
        self.proc.wait(30)


class Real:
    name = "nvidia-cuda-mps-control"

    def __init__(self, binary: str, driver: Clients, uuid: str) -> None:
        self.binary, self.driver, self.uuid = binary, driver, uuid

    def _env(self, pipe: Path, extra: Mapping[str, str] = {}) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_VISIBLE_DEVICES": self.uuid, **extra}

    def start(self, pipe: Path) -> None:
        pipe.mkdir(parents=True, exist_ok=True)
        env = os.environ | self._env(pipe) | {"CUDA_MPS_LOG_DIRECTORY": str(pipe)}
        done = subprocess.run([self.binary, "-d", "-M"], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True,
                              text=True, timeout=20, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert mps_contract.wait_until(lambda: self.control(pipe, "get_server_list").returncode == 0, 10)

    def control(self, pipe: Path, command: str) -> subprocess.CompletedProcess[str]:
        return control(self.binary, pipe, command)

    def busy(self, pipe: Path, seconds: float, env: Mapping[str, str] = {}) -> RealBusy:
        return RealBusy(self.driver, self._env(pipe, env), seconds)

    def usable_mib(self, pipe: Path, env: Mapping[str, str]) -> int | None:
        cap = 16384
        done = self.driver.run("alloc", ["--cap-mib", str(cap), "--step-mib", "512"], self._env(pipe, env))
        got = int(done.body.get("max_mib", 0))
        return None if got >= cap else got


@pytest.fixture
def pipe() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="gpupack-contract-"))
    root.chmod(0o755)
    yield root / "pipe"
    with contextlib.suppress(OSError, ValueError):
        control("nvidia-cuda-mps-control", root / "pipe", "quit")
        os.kill(mps_contract.daemon_pid(root / "pipe"), signal.SIGKILL)


@pytest.mark.parametrize("check", mps_contract.CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_nvidias_mps_follows_the_measured_contract(
    check: Callable[..., None], pipe: Path, real_nvml: Nvml, mps_binary: str, driver: Clients
) -> None:
    check(Real(mps_binary, driver, real_nvml.uuid(0)), pipe)
