"""The stand-in MPS control daemon (tests/standin/mps_control.py, multi-user `-M`) run on the real node's
host, in the node's MPS pipe directory: there is no GPU and no MPS binary here, so it stands in for
`nvidia-cuda-mps-control -d -M` as the node side's backend. `stop()` ends it (its socket goes with it), as
a daemon that died or was never started leaves MPS pods without a backend.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests/standin/mps_control.py"


class MpsStandIn:
    def __init__(self, pipe_dir: Path, log_dir: Path) -> None:
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def control(self) -> Path:
        return self.pipe_dir / "control"

    def start(self, timeout_s: float = 10) -> None:
        env = {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }
        self._proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "-f", "-M"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                try:
                    s.connect(str(self.control))
                    return
                except OSError:
                    time.sleep(0.05)
        raise RuntimeError(
            f"the stand-in MPS daemon did not answer at {self.control} (log in {self.log_dir})"
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)  # it stops its servers and removes its socket
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
