"""Rehearsal stand-in for libcuda, behind tests/gpu/cudadrv.py (GPUPACK_FAKE_CUDA=1). Not a GPU model.

It follows the contract the suite checks on a real GPU closely enough to exercise the suite's plumbing:
- one GPU (FAKE_CUDA_MEMORY_MIB, 132 SMs), visible when CUDA_VISIBLE_DEVICES is unset or names it;
- MPS only when a stand-in daemon (fakecuda/nvidia-cuda-mps-control) answers on
  $CUDA_MPS_PIPE_DIRECTORY/control, so a directory holding only a hard link to `control` reaches it;
  legacy: the lower of the daemon default and the client env; v3 namespace `$PIPE/<server>/<ns>`: the
  namespace's thread percentage wins over the env, a pinned-limit env entry naming a GPU the process
  cannot see drops every pinned limit (NVIDIA's documented escape);
- per-cgroup hard limits from FAKE_CUDA_LIMITS (JSON, written by the suite's stand-in limit setter),
  keyed by the caller's real cgroup v2 path: the nearest limited ancestor caps allocations, and a limit
  on the caller's own leaf is what cuMemGetInfo reports as total.
It models no compute mode, no per-uid servers and no eviction: the suite skips those in a rehearsal.
"""

from __future__ import annotations

import json
import math
import os
import socket
from typing import Any

UUID = "GPU-11111111-2222-3333-4444-555555555555"
MIB = 1 << 20
SMS = 132


class FakeDriver:
    def __init__(self, error: type[Exception]) -> None:
        self.error = error  # cudadrv.CudaError of the running script
        self.ready = False
        self.used = 0
        self.next_ptr = 1 << 32
        self.sizes: dict[int, int] = {}
        self.mps = self._daemon()

    def _fail(self, call: str, name: str, code: int) -> None:
        raise self.error(call, code, name)

    def _visible(self) -> bool:
        v = os.environ.get("CUDA_VISIBLE_DEVICES")
        return v is None or UUID in v.split(",") or v.split(",")[0] == "0"

    @staticmethod
    def _daemon() -> dict[str, Any] | None:
        pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                s.settimeout(5)
                s.connect(os.path.join(pipe, "control"))
                reply = json.loads(s.recv(65536))
            with open(reply["state"]) as f:
                state: dict[str, Any] = json.load(f)
        except (OSError, ValueError, KeyError):
            return None
        rel = os.path.relpath(os.path.realpath(pipe), os.path.realpath(state["pipe"]))
        state["namespace"] = state.get("namespaces", {}).get(rel)
        return state

    def _memory_total(self) -> int:
        return int(os.environ.get("FAKE_CUDA_MEMORY_MIB", "16384")) * MIB

    def init(self) -> None:
        self.ready = True

    def version(self) -> int:
        return 13040

    def count(self) -> int:
        if not self.ready:
            self._fail("cuDeviceGetCount", "CUDA_ERROR_NOT_INITIALIZED", 3)
        return 1 if self._visible() else 0

    def device(self, ordinal: int) -> dict[str, Any]:
        if ordinal >= self.count():
            self._fail(
                "cuDeviceGet", "CUDA_ERROR_INVALID_DEVICE" if self.count() else "CUDA_ERROR_NO_DEVICE", 101
            )
        return {"uuid": UUID, "name": "Fake GPU", "total_mib": self._memory_total() // MIB, "sm_count": SMS}

    def context(self, ordinal: int) -> None:
        self.device(ordinal)

    # --- limits ---

    def _cgroup_limit(self) -> tuple[int | None, bool]:
        """(hard limit in bytes of the nearest limited cgroup, whether it is our own leaf)."""
        path = os.environ.get("FAKE_CUDA_LIMITS")
        if not path:
            return None, False
        try:
            with open(path) as f:
                limits: dict[str, dict[str, int]] = json.load(f)
            with open("/proc/self/cgroup") as f:
                own = next((ln.strip()[3:] for ln in f if ln.startswith("0::")), "/")
        except (OSError, ValueError):
            return None, False
        probe = own
        while True:
            if probe in limits:
                return int(limits[probe]["hard"]), probe == own
            if probe in ("/", ""):
                return None, False
            probe = os.path.dirname(probe)

    def _pinned(self) -> int | None:
        if self.mps is None:
            return None
        ns = self.mps["namespace"]
        daemon = (
            ns.get("pinned")
            if ns is not None
            else self.mps["pinned"].get("0") or self.mps["pinned"].get(UUID)
        )
        values = [_mib(str(daemon))] if daemon else []
        env = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")
        entries = [e.split("=", 1) for e in env.split(",") if "=" in e]
        if any(not k.isdigit() or int(k) >= self.count() for k, _ in entries):
            return None  # an entry for a GPU we cannot see: the client drops every pinned limit
        values += [_mib(v) for k, v in entries if k == "0"]
        known = [v for v in values if v is not None]
        return min(known) if known else None

    def _limit(self) -> int:
        limit = self._memory_total()
        for cap in (self._pinned(), self._cgroup_limit()[0]):
            if cap is not None:
                limit = min(limit, cap)
        return limit

    def mem_info(self) -> tuple[int, int]:
        hard, own = self._cgroup_limit()
        total = hard if own and hard is not None else self._memory_total()
        return max(0, self._limit() - self.used), total

    def context_sm_count(self) -> int | None:
        pct = 100
        if self.mps is not None:
            ns = self.mps["namespace"]
            if ns is not None and "thread" in ns:
                pct = int(ns["thread"])  # a namespace's percentage overrides the client's env
            else:
                pct = min(
                    int(self.mps["thread"]), int(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"))
                )
        return math.ceil(SMS * pct / 100)

    def alloc(self, nbytes: int) -> int:
        if self.used + nbytes > self._limit():
            self._fail("cuMemAlloc_v2", "CUDA_ERROR_OUT_OF_MEMORY", 2)
        self.used += nbytes
        self.next_ptr += nbytes
        self.sizes[self.next_ptr] = nbytes
        return self.next_ptr

    def free(self, ptr: int) -> None:
        self.used -= self.sizes.pop(ptr)

    def touch(self, ptr: int, nbytes: int) -> None:
        if ptr not in self.sizes:
            self._fail("cuMemsetD8_v2", "CUDA_ERROR_INVALID_VALUE", 1)


def _mib(value: str) -> int | None:
    """'4096M', '4G' or '4096' (MiB) in bytes; None for anything else."""
    v = value.strip()
    scale = {"M": 1, "G": 1024}.get(v[-1:])
    digits = v[:-1] if scale else v
    if not digits.isdigit():
        return None
    return int(digits) * (scale or 1) * MIB
