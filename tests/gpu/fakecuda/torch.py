"""A stand-in for the torch calls tests/gpu/workload.py makes, so CI runs the client harness without a GPU.

Only ever on a child process's PYTHONPATH (tests/gpu/test_gpu_harness.py, and the rehearsal described in
tests/gpu/README.md). One GPU, chosen like CUDA does: visible when CUDA_VISIBLE_DEVICES is unset or names
its UUID; FAKE_CUDA_MEMORY_MIB sizes it. Like CUDA, the CUDA_MPS_* variables count only when an MPS daemon
answers in CUDA_MPS_PIPE_DIRECTORY (here the fake control's state file): then allocations stop at the lower
of the client's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and the daemon default, and a matmul takes
FAKE_CUDA_MATMUL_S x 100 / (active thread percentage) seconds.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

__version__ = "0.0+fake"
UUID = "11111111-2222-3333-4444-555555555555"
MIB = 1 << 20
uint8, float16 = "uint8", "float16"
_device = {"used_mib": 0}


class OutOfMemoryError(RuntimeError):
    pass


def _daemon() -> dict[str, Any] | None:
    """The fake MPS control daemon's state, if one is alive in our pipe dir."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not pipe:
        return None
    try:
        with open(os.path.join(pipe, "fake-mps.json")) as f:
            state: dict[str, Any] = json.load(f)
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return None
    return state


def _mib(value: str) -> int | None:
    return int(value[:-1]) if value.endswith("M") and value[:-1].isdigit() else None


def _limit_mib() -> int:
    limit = int(os.environ.get("FAKE_CUDA_MEMORY_MIB", "16384"))
    daemon = _daemon()
    if daemon is None:
        return limit
    for value in (
        # The daemon's default for this device, set by ordinal or by UUID (the agent uses the UUID).
        str(daemon["pinned"].get("0") or daemon["pinned"].get(f"GPU-{UUID}", "")),
        os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "").removeprefix("0="),
    ):
        mib = _mib(value)
        if mib is not None:
            limit = min(limit, mib)
    return limit


def _thread_share() -> int:
    daemon = _daemon()
    if daemon is None:
        return 100
    return min(int(daemon["thread"]), int(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")))


class Tensor:
    def __init__(self, mib: int) -> None:
        self.mib = mib

    def __matmul__(self, other: Any) -> Tensor:
        time.sleep(float(os.environ.get("FAKE_CUDA_MATMUL_S", "0.001")) * 100 / _thread_share())
        return Tensor(0)

    def __del__(self) -> None:
        _device["used_mib"] -= self.mib


def empty(nbytes: int, dtype: str, device: str) -> Tensor:
    if not cuda.device_count():
        raise RuntimeError("CUDA error: no CUDA-capable device is detected")
    mib = -(-nbytes // MIB)
    if _device["used_mib"] + mib > _limit_mib():
        raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {mib} MiB")
    _device["used_mib"] += mib
    return Tensor(mib)


def randn(*shape: int, device: str, dtype: str) -> Tensor:
    return empty(0, dtype, device)


class _Props:
    uuid = UUID
    name = "Fake GPU"

    @property
    def total_memory(self) -> int:
        return int(os.environ.get("FAKE_CUDA_MEMORY_MIB", "16384")) * MIB


class cuda:  # noqa: N801 - spelled as torch spells its module
    @staticmethod
    def device_count() -> int:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return 1 if visible is None or visible in (UUID, f"GPU-{UUID}") else 0

    @staticmethod
    def get_device_properties(index: int) -> _Props:
        if index >= cuda.device_count():
            raise RuntimeError(f"invalid device ordinal {index}")
        return _Props()

    @staticmethod
    def synchronize() -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None
