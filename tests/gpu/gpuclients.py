"""CUDA client processes for the GPU suite (workload.py run with a pod's env) and deadline polling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKLOAD = Path(__file__).with_name("workload.py")


@dataclass(frozen=True, slots=True)
class ClientResult:
    rc: int
    body: dict[str, Any]
    stderr: str


class Clients:
    """Starts workload.py as separate CUDA processes with a given env."""

    def __init__(self, lib: str, lib_version: str) -> None:
        self.lib, self.lib_version = lib, lib_version

    @staticmethod
    def env(extra: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.update(extra)
        return env

    def start(self, mode: str, args: list[str], extra_env: Mapping[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(WORKLOAD), mode, *args],
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
        self, mode: str, args: list[str], extra_env: Mapping[str, str], timeout_s: float = 180
    ) -> ClientResult:
        return self.finish(self.start(mode, args, extra_env), timeout_s)


def wait_for(pred: Callable[[], object], timeout_s: float, interval_s: float = 0.2) -> bool:
    """Poll `pred()` until it is truthy or the deadline passes; returns its last verdict."""
    deadline = time.monotonic() + timeout_s
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
