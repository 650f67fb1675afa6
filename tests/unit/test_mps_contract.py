"""The measured MPS contract (tests/contract/mps_contract.py) holds for the stand-in daemon that every CPU
tier runs (tests/standin/mps_control.py). tests/gpu/test_gpu_mps_contract.py asserts the same of NVIDIA's
binary on a GPU."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.contract import mps_contract
from tests.contract.mps_contract import Finished

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "mps_control.py"


def env_of(pipe: Path, extra: Mapping[str, str] = {}) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    return (
        env
        | {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(pipe.parent / "log")}
        | dict(extra)
    )


class StandinBusy:
    def __init__(self, pipe: Path, seconds: float, env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(STANDIN), "client", "--work", str(seconds)],
            env=env_of(pipe, env), stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.pid = self.proc.pid
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        assert first.startswith("server "), first

    def result(self, timeout_s: float) -> Finished:
        out, _ = self.proc.communicate(timeout=timeout_s)
        last = out.strip().splitlines()[-1] if out.strip() else ""
        return Finished(self.proc.returncode == 0 and last == "done", last.removeprefix("error "), out)

    def kill(self, sig: int) -> None:
        os.kill(self.pid, sig)
        self.proc.wait(10)


class Standin:
    name = "stand-in"

    def start(self, pipe: Path) -> None:
        done = subprocess.run([sys.executable, str(STANDIN), "-d", "-M"], env=env_of(pipe),
                              capture_output=True,
                              text=True, timeout=20, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr

    def control(self, pipe: Path, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(STANDIN)], input=command + "\n", env=env_of(pipe),
                              capture_output=True, text=True, timeout=20, check=False)  # fmt: skip

    def busy(self, pipe: Path, seconds: float, env: Mapping[str, str] = {}) -> StandinBusy:
        return StandinBusy(pipe, seconds, env)

    def usable_mib(self, pipe: Path, env: Mapping[str, str]) -> int | None:
        done = subprocess.run([sys.executable, str(STANDIN), "client", "--memory"], env=env_of(pipe, env),
                              capture_output=True, text=True, timeout=20, check=False)  # fmt: skip
        (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("usable ")]
        value = line.split()[1]
        return None if value == "unlimited" else int(value)


@pytest.fixture
def pipe() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="contract-", dir="/tmp"))  # short: unix socket paths
    root.chmod(0o755)
    yield root / "pipe"
    Standin().control(root / "pipe", "quit")
    with contextlib.suppress(OSError, ValueError):
        os.kill(mps_contract.daemon_pid(root / "pipe"), signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="control_privileged is root's, as on a node")
@pytest.mark.parametrize("check", mps_contract.CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_the_standin_follows_the_measured_contract(check: Callable[..., None], pipe: Path) -> None:
    check(Standin(), pipe)
