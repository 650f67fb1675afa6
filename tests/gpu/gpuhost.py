"""What the host gives the GPU suite beyond the GPU: namespaces, other uids, cgroup v2 leaves, and per-cgroup
GPU memory limits (NVML nvmlDeviceSetMemoryLimits_v1, or the rehearsal's stand-in).

Each `*_missing()` returns why the host cannot run a kind of test ("" when it can), so tests skip with the
reason instead of failing on the host.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

CGROUP_ROOT = Path("/sys/fs/cgroup")
MEMACCT_DRIVER_MAJOR = 615  # r615 / CUDA 13.4: MPS v3 and per-cgroup memory limits
NOBODY = 65534  # the "other tenant": a uid that exists on every Linux image
REHEARSAL = os.environ.get("GPUPACK_GPU_REHEARSAL") == "1"  # stand-ins instead of a GPU (README)
MIB = 1 << 20


# --- what the host allows ---


def root_missing() -> str:
    return "" if os.geteuid() == 0 else f"needs root (running as uid {os.geteuid()})"


def namespaces_missing() -> str:
    """Why `unshare --ipc --mount` with a fresh /dev/shm cannot run here ("" when it can)."""
    if shutil.which("unshare") is None:
        return "util-linux `unshare` is not on PATH"
    probe = subprocess.run(
        [*namespace_argv("private"), "true"], capture_output=True, text=True, timeout=30, check=False
    )
    if probe.returncode != 0:
        return f"unshare --ipc --mount with a private /dev/shm failed here: {probe.stderr.strip()[:300]}"
    return ""


def setpriv_missing() -> str:
    if shutil.which("setpriv") is None:
        return "util-linux `setpriv` is not on PATH (needed to run a control command as another uid)"
    return root_missing()


def namespace_argv(shm: str, pid: bool = False) -> list[str]:
    """argv prefix that runs a command in its own IPC and mount namespace, as a container runs.

    shm "private": a fresh 64 MiB tmpfs on /dev/shm (a pod's own, as the kubelet gives); "daemon": the
    host's /dev/shm, where the MPS daemon and its server keep theirs (what NVIDIA's device plugin mounts).
    pid: also a pid namespace (a pod without hostPID); /proc is remounted so the client sees its own pids.
    """
    if shm not in ("private", "daemon"):
        raise ValueError(f"shm {shm!r}: want 'private' or 'daemon'")
    argv = ["unshare", "--ipc", "--mount", "--propagation", "private"]
    if pid:
        argv += ["--pid", "--fork", "--mount-proc"]
    if shm == "daemon":
        return [*argv, "--"]
    script = 'mount -t tmpfs -o size=64m,nosuid,nodev,mode=1777 shm /dev/shm && exec "$@"'
    return [*argv, "--", "sh", "-c", script, "sh"]


def driver_major(version: str) -> int | None:
    m = re.match(r"\s*(\d+)", version)
    return int(m.group(1)) if m else None


def driver_missing(driver_version: str) -> str:
    """Why this driver has no MPS v3 or per-cgroup memory limits ("" from r615 on)."""
    major = driver_major(driver_version)
    if major is None or major < MEMACCT_DRIVER_MAJOR:
        return (
            f"driver {driver_version or '?'} is older than r{MEMACCT_DRIVER_MAJOR} "
            "(per-cgroup GPU memory limits and MPS v3 need r615 / CUDA 13.4)"
        )
    return ""


def memacct_missing(driver_version: str, cgroup_root: Path = CGROUP_ROOT) -> str:
    """Why per-cgroup GPU memory limits cannot be tried here ("" when NVML may accept one)."""
    too_old = driver_missing(driver_version)
    if too_old:
        return too_old
    if not (cgroup_root / "cgroup.controllers").is_file():
        return f"{cgroup_root} is not a cgroup v2 hierarchy (memory partitioning needs cgroup v2 there)"
    return ""


def memacct_backend(cgroup_root: Path = CGROUP_ROOT) -> str:
    """ "dmem" where the kernel's dmem controller lists an NVIDIA region, else "misc or none" (the driver's
    flat fallback; which one the driver chose is not readable from here: UNVERIFIED)."""
    try:
        controllers = (cgroup_root / "cgroup.controllers").read_text().split()
        capacity = (cgroup_root / "dmem.capacity").read_text()
    except OSError:
        return "misc or none"
    return "dmem" if "dmem" in controllers and "nvidia" in capacity else "misc or none"


# --- cgroup v2 leaves ---


@dataclass
class Leaves:
    """Leaf cgroups under `<root>/gpupack-gpu-<pid>/`, removed (after their limits are cleared) on close."""

    root: Path
    enable: Sequence[str] = ("dmem",)
    made: list[Path] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def parent(self) -> Path:
        return self.root / f"gpupack-gpu-{os.getpid()}"

    def missing(self) -> str:
        """Why no leaf can be made here ("" when one can)."""
        if not (self.root / "cgroup.procs").exists():
            return f"{self.root} is not a cgroup v2 mount"
        if not os.access(self.root, os.W_OK):
            return f"{self.root} is not writable here"
        return ""

    def leaf(self, name: str) -> Path:
        if not self.parent.exists():
            self.parent.mkdir()
            for ctrl in self.enable:  # limits need `+dmem` on every level above the leaf
                for level in (self.root, self.parent):
                    try:
                        (level / "cgroup.subtree_control").write_text(f"+{ctrl}")
                    except OSError as exc:
                        self.notes[f"+{ctrl} {level}"] = str(exc)
        path = self.parent / name
        path.mkdir()
        self.made.append(path)
        return path

    def relative(self, path: Path) -> str:
        """The path as a process inside it reads its own cgroup (`0::` line of /proc/self/cgroup)."""
        return "/" + str(path.relative_to(self.root))

    def close(self) -> list[str]:
        """Remove every leaf and the parent; what could not be removed (a leaked cgroup is a finding)."""
        left = []
        for path in [*reversed(self.made), self.parent]:
            try:
                path.rmdir()
            except FileNotFoundError:
                continue
            except OSError as exc:
                left.append(f"{path}: {exc}")
        return left


# --- per-cgroup GPU memory limits ---


class Limits(Protocol):
    binding: str

    def set(self, uuid: str, cgroup: Path, soft: int, hard: int) -> None: ...
    def get(self, uuid: str, cgroup: Path) -> dict[str, int]: ...
    def clear(self, uuid: str, cgroup: Path) -> None: ...


class LimitError(Exception):
    """NVML refused a limit; `unsupported` when the host cannot have one at all (skip, not fail)."""

    def __init__(self, message: str, unsupported: bool) -> None:
        super().__init__(message)
        self.unsupported = unsupported


class _Set(ctypes.Structure):  # nvmlSetMemoryLimits_v1_t (NVML API reference; no version field)
    _fields_ = [
        ("nameSpace", ctypes.c_char_p),
        ("softLimit", ctypes.c_ulonglong),
        ("hardLimit", ctypes.c_ulonglong),
    ]


class _Get(ctypes.Structure):  # nvmlGetMemoryLimits_v1_t
    _fields_ = [
        ("nameSpace", ctypes.c_char_p),
        ("softLimit", ctypes.c_ulonglong),
        ("hardLimit", ctypes.c_ulonglong),
        ("currentUsed", ctypes.c_ulonglong),
    ]


class NvmlLimits:
    """nvmlDeviceSet/GetMemoryLimits_v1 on the process's initialized NVML: through nvidia-ml-py's binding
    where it has one (13.615+), else the same C entry points through ctypes with the documented structs."""

    MAX = 0xFFFFFFFFFFFFFFFF  # NVML_DEVICE_MEMORY_LIMIT_MAX: no hard limit

    def __init__(self) -> None:
        import pynvml

        self.nv: Any = pynvml
        bound = hasattr(pynvml, "nvmlDeviceSetMemoryLimits_v1")
        self.binding = "nvidia-ml-py" if bound else "ctypes (nvidia-ml-py has no binding)"

    def _call(self, name: str, uuid: str, body: ctypes.Structure) -> None:
        nv = self.nv
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid.encode())
            if hasattr(nv, name):
                getattr(nv, name)(handle, body)
            else:
                nv._nvmlCheckReturn(nv._nvmlGetFunctionPointer(name)(handle, ctypes.byref(body)))
        except nv.NVMLError as exc:
            unsupported = exc.value in (
                nv.NVML_ERROR_NOT_SUPPORTED,
                nv.NVML_ERROR_FUNCTION_NOT_FOUND,
                nv.NVML_ERROR_NOT_FOUND,
            )
            raise LimitError(f"{name}: {exc}", unsupported) from exc

    def set(self, uuid: str, cgroup: Path, soft: int, hard: int) -> None:
        st = (
            self.nv.c_nvmlSetMemoryLimits_v1_t() if hasattr(self.nv, "c_nvmlSetMemoryLimits_v1_t") else _Set()
        )
        st.nameSpace, st.softLimit, st.hardLimit = str(cgroup).encode(), soft, hard
        self._call("nvmlDeviceSetMemoryLimits_v1", uuid, st)

    def get(self, uuid: str, cgroup: Path) -> dict[str, int]:
        st = (
            self.nv.c_nvmlGetMemoryLimits_v1_t() if hasattr(self.nv, "c_nvmlGetMemoryLimits_v1_t") else _Get()
        )
        st.nameSpace = str(cgroup).encode()
        self._call("nvmlDeviceGetMemoryLimits_v1", uuid, st)
        return {"soft": int(st.softLimit), "hard": int(st.hardLimit), "current_used": int(st.currentUsed)}

    def clear(self, uuid: str, cgroup: Path) -> None:
        self.set(uuid, cgroup, 0, self.MAX)


class StandInLimits:
    """Rehearsal stand-in: limits in a JSON file the stand-in driver reads (FAKE_CUDA_LIMITS), keyed by the
    cgroup as its processes see it. Proves the suite's plumbing, not the driver."""

    binding = "stand-in"

    def __init__(self, path: Path, leaves: Leaves) -> None:
        self.path, self.leaves = path, leaves

    def _load(self) -> dict[str, dict[str, int]]:
        try:
            data: dict[str, dict[str, int]] = json.loads(self.path.read_text())
            return data
        except (OSError, ValueError):
            return {}

    def set(self, uuid: str, cgroup: Path, soft: int, hard: int) -> None:
        if not cgroup.is_dir():
            raise LimitError(f"nvmlDeviceSetMemoryLimits_v1: {cgroup}: Not Found", unsupported=False)
        data = self._load()
        data[self.leaves.relative(cgroup)] = {"soft": soft, "hard": hard}
        self.path.write_text(json.dumps(data))

    def get(self, uuid: str, cgroup: Path) -> dict[str, int]:
        got = self._load().get(self.leaves.relative(cgroup), {"soft": 0, "hard": NvmlLimits.MAX})
        return got | {"current_used": 0}

    def clear(self, uuid: str, cgroup: Path) -> None:
        data = self._load()
        data.pop(self.leaves.relative(cgroup), None)
        self.path.write_text(json.dumps(data))


@contextlib.contextmanager
def limited(limits: Limits, uuid: str, cgroup: Path, soft: int, hard: int) -> Iterator[dict[str, int]]:
    """A limit on `cgroup` for the block (read back as NVML stored it), cleared after: soft first to 0,
    so a leaf removed later leaks no reservation into its ancestors."""
    limits.set(uuid, cgroup, soft, hard)
    try:
        yield limits.get(uuid, cgroup)
    finally:
        limits.clear(uuid, cgroup)
