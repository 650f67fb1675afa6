"""CUDA client processes for the GPU suite (workload.py or cudadrv.py with a pod's env); deadline polling."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKLOAD = Path(__file__).with_name("workload.py")  # over torch or CuPy
CUDADRV = Path(__file__).with_name("cudadrv.py")  # over libcuda alone


@dataclass(frozen=True, slots=True)
class ClientResult:
    rc: int
    body: dict[str, Any]
    stderr: str


class Clients:
    """Starts a client script (workload.py unless told) as separate CUDA processes with a given env,
    optionally behind an argv prefix (e.g. `unshare ...`, so the client runs as a container's would)."""

    def __init__(self, lib: str, lib_version: str, script: Path = WORKLOAD) -> None:
        self.lib, self.lib_version, self.script = lib, lib_version, script

    @staticmethod
    def env(extra: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.update(extra)
        return env

    def start(
        self, mode: str, args: list[str], extra_env: Mapping[str, str], prefix: Sequence[str] = ()
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*prefix, sys.executable, str(self.script), mode, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(extra_env),
        )

    @staticmethod
    def finish(proc: subprocess.Popen[str], timeout_s: float) -> ClientResult:
        if proc.stdin is not None and proc.stdin.closed:
            proc.stdin = (
                None  # closed by the caller (how `hold` is told to stop); communicate() would flush it
            )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return ClientResult(-9, {"error": f"timed out after {timeout_s}s"}, err[-2000:])
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        body: dict[str, Any] = (
            json.loads(lines[-1]) if lines else {"error": f"no JSON on stdout: {out[-500:]}"}
        )
        return ClientResult(proc.returncode, body, err[-2000:])

    def run(
        self,
        mode: str,
        args: list[str],
        extra_env: Mapping[str, str],
        timeout_s: float = 180,
        prefix: Sequence[str] = (),
    ) -> ClientResult:
        return self.finish(self.start(mode, args, extra_env, prefix), timeout_s)

    def ready(self, proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
        """The `hold` client's first line: {"ready": true, ...} once it holds its memory, or its error
        ({"error": ..., "timed_out": true} when it had said nothing by the deadline: still waiting)."""
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        if not ready:
            return {"error": f"no answer within {timeout_s}s", "timed_out": True}
        line = proc.stdout.readline()
        try:
            body: dict[str, Any] = json.loads(line)
        except ValueError:
            return {"error": f"not JSON: {line[-300:]!r}"}
        return body

    @staticmethod
    def release(proc: subprocess.Popen[str], timeout_s: float = 60) -> ClientResult:
        """Tell a `hold` client to finish (close its stdin) and collect its answer."""
        if proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()
        return Clients.finish(proc, timeout_s)


def wait_for(pred: Callable[[], object], timeout_s: float, interval_s: float = 0.2) -> bool:
    """Poll `pred()` until it is truthy or the deadline passes; returns its last verdict."""
    deadline = time.monotonic() + timeout_s
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
