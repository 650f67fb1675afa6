"""The simulated driver's per-cgroup GPU memory accounting (MPS v3 memory partitioning, misc backend).

What NVIDIA documents (mpsv3-memory-partitioning, nvmlDeviceSetMemoryLimits_v1), kept per GPU:
- each cgroup v2 directory may carry a soft limit (guaranteed share) and a hard limit (bytes);
- an allocation by a process is charged to its cgroup; it fails with CUDA_ERROR_OUT_OF_MEMORY when it
  would take the nearest hard-limited cgroup (itself or an ancestor: the misc backend's flat model,
  "nearest limited ancestor; limits do not nest") or the GPU past its memory;
- `current_used` of a cgroup is what its processes (and its descendants') hold now;
- soft 0 and hard NVML_DEVICE_MEMORY_LIMIT_MAX clear a cgroup: it leaves the table.

State lives in one JSON file per GPU under a directory (the simulated driver's state, shared by every
process of the node that uses the simulated GPUs: agent, allocator, tests on the host), each read and
written under an exclusive flock; without a directory it is kept in memory. Each limit also records when
it was set (CLOCK_BOOTTIME ns), which no NVIDIA call returns: the simulation's evidence that a container
had its limits before its first process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.nvml.base import MEMORY_LIMIT_MAX

OUT_OF_MEMORY = "CUDA_ERROR_OUT_OF_MEMORY"


@dataclass(frozen=True, slots=True)
class Refused:
    """An allocation the simulated driver refused, and why (CUDA's error name first)."""

    reason: str


def _within(cgroup: str, ancestor: str) -> bool:
    return cgroup == ancestor or cgroup.startswith(ancestor.rstrip("/") + "/")


class LimitTable:
    """Limits and allocations per GPU uuid; `path_dir` None keeps them in this object only."""

    def __init__(self, path_dir: Path | None) -> None:
        self.path_dir = path_dir
        self._memory: dict[str, dict[str, Any]] = {}

    def _file(self, uuid: str) -> Path | None:
        return None if self.path_dir is None else self.path_dir / "memory-limits" / f"{uuid}.json"

    @contextlib.contextmanager
    def _locked(self, uuid: str) -> Iterator[dict[str, Any]]:
        """The GPU's table, written back when the block ends without an exception."""
        path = self._file(uuid)
        if path is None:
            table = self._memory.setdefault(uuid, {"limits": {}, "allocations": {}})
            yield table
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                table = json.loads(path.read_text())
            except (OSError, ValueError):
                table = {"limits": {}, "allocations": {}}
            yield table
            tmp = path.with_suffix(f".tmp-{os.getpid()}")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
            tmp.replace(path)

    def get(self, uuid: str, cgroup: str) -> tuple[int, int, int]:
        """(soft, hard, current used) of `cgroup`; an unlimited cgroup reads 0 / MAX."""
        with self._locked(uuid) as t:
            entry = t["limits"].get(cgroup) or {}
            used = sum(a["bytes"] for a in t["allocations"].values() if _within(a["cgroup"], cgroup))
            return int(entry.get("soft", 0)), int(entry.get("hard", MEMORY_LIMIT_MAX)), used

    def set(self, uuid: str, cgroup: str, soft: int, hard: int) -> None:
        with self._locked(uuid) as t:
            if soft == 0 and hard == MEMORY_LIMIT_MAX:
                t["limits"].pop(cgroup, None)
                return
            boottime = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
            t["limits"][cgroup] = {"soft": soft, "hard": hard, "set_boottime_ns": boottime}

    def limited(self, uuid: str) -> dict[str, dict[str, int]]:
        """Every cgroup with a limit on the GPU: {cgroup: {soft, hard, set_boottime_ns}}."""
        with self._locked(uuid) as t:
            return {k: dict(v) for k, v in t["limits"].items()}

    def allocate(
        self, uuid: str, cgroup: str, holder: str, nbytes: int, capacity: int, *, pid: int = 0
    ) -> int | Refused:
        """Charge `nbytes` to `cgroup` for `holder` (process `pid`, 0: not known); the cgroup's new usage,
        or the refusal."""
        with self._locked(uuid) as t:
            allocations: dict[str, Any] = t["allocations"]
            limits: dict[str, Any] = t["limits"]
            total = sum(a["bytes"] for a in allocations.values())
            if total + nbytes > capacity:
                return Refused(f"{OUT_OF_MEMORY}: the GPU has {capacity - total} bytes free")
            limited = [c for c in limits if _within(cgroup, c) and limits[c]["hard"] != MEMORY_LIMIT_MAX]
            if limited:
                nearest = max(limited, key=len)
                hard = int(limits[nearest]["hard"])
                used = sum(a["bytes"] for a in allocations.values() if _within(a["cgroup"], nearest))
                if used + nbytes > hard:
                    return Refused(
                        f"{OUT_OF_MEMORY}: hard limit {hard} bytes of cgroup {nearest}, "
                        f"{used} bytes in use, {nbytes} asked"
                    )
            held = allocations.setdefault(holder, {"cgroup": cgroup, "bytes": 0, "pid": pid})
            held["bytes"] += nbytes
            return int(sum(a["bytes"] for a in allocations.values() if _within(a["cgroup"], cgroup)))

    def holders(self, uuid: str) -> dict[int, int]:
        """pid → bytes held on the GPU, for every known process with an allocation (NVML lists each
        process with a context; here, one holding memory)."""
        out: dict[int, int] = {}
        with self._locked(uuid) as t:
            for a in t["allocations"].values():
                pid = int(a.get("pid", 0))
                if pid > 0:
                    out[pid] = out.get(pid, 0) + int(a["bytes"])
        return out

    def release(self, uuid: str, holder: str) -> None:
        with self._locked(uuid) as t:
            t["allocations"].pop(holder, None)

    def release_all(self, uuid: str) -> None:
        """Forget every allocation (the allocator restarted: no earlier connection holds memory)."""
        with self._locked(uuid) as t:
            t["allocations"] = {}
