"""A CUDA client on the driver API (libcuda.so.1 through ctypes), run as its own process by the GPU suite.

Needs no toolkit, compiler or framework: only the driver's libcuda. Standalone on purpose (stdlib only,
imports neither gpupack nor pytest), because the suite runs it inside namespaces, cgroups and as other
uids, and reads one JSON object from its stdout.

  cudadrv.py probe                       driver version; every visible device: UUID, name, memory, SMs
  cudadrv.py meminfo                     a context on device 0: cuMemGetInfo free/total, SMs it may use
  cudadrv.py alloc [--cap-mib N]         cuMemAlloc until the driver refuses; the most that fit, and why
  cudadrv.py hold --mib M [--seconds S]  allocate M MiB, print {"ready": ...}, touch it until stdin closes;
                                         reports the first CUDA error a call got meanwhile (e.g. eviction)

Before CUDA is touched, in this order: --cgroup DIR joins that cgroup v2 (writes 0 to DIR/cgroup.procs),
--gid/--uid drop to that user (as a container's process runs). Every answer carries where the process ran:
pid, uid, its cgroup v2 path, its IPC and mount namespaces and the device of its /dev/shm.

Every mode prints exactly one JSON line (hold prints its "ready" line first); a CUDA failure prints
{"error": ..., "cuda_error": "CUDA_ERROR_..."} and exits 3.

GPUPACK_FAKE_CUDA=1 swaps libcuda for the rehearsal's stand-in driver (tests/gpu/fakecuda/fakedriver.py).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import sys
import time
from typing import Any, Protocol

MIB = 1 << 20
ATTR_MULTIPROCESSOR_COUNT = 16  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
EXEC_AFFINITY_SM_COUNT = 0  # CU_EXEC_AFFINITY_TYPE_SM_COUNT


class CudaError(Exception):
    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call}: {name} ({code})")
        self.call, self.code, self.name = call, code, name


class Driver(Protocol):
    """The driver calls the modes use; device 0 of the visible ones once `context()` ran."""

    def init(self) -> None: ...
    def version(self) -> int: ...
    def count(self) -> int: ...
    def device(self, ordinal: int) -> dict[str, Any]: ...
    def context(self, ordinal: int) -> None: ...
    def mem_info(self) -> tuple[int, int]: ...
    def context_sm_count(self) -> int | None: ...
    def alloc(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def touch(self, ptr: int, nbytes: int) -> None: ...


class _ExecAffinity(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("sm_count", ctypes.c_uint)]


class LibCuda:
    """libcuda.so.1. Contexts are the device's primary context (what the CUDA runtime and frameworks use),
    so no versioned cuCtxCreate entry point is needed."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.lib.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
        self.lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.dev = ctypes.c_int(0)

    def _call(self, name: str, *args: Any) -> None:
        rc = int(getattr(self.lib, name)(*args))
        if rc != 0:
            text = ctypes.c_char_p()
            got = self.lib.cuGetErrorName(rc, ctypes.byref(text))
            raise CudaError(name, rc, text.value.decode() if got == 0 and text.value else f"CUresult {rc}")

    def init(self) -> None:
        self._call("cuInit", 0)

    def version(self) -> int:
        v = ctypes.c_int()
        self._call("cuDriverGetVersion", ctypes.byref(v))
        return v.value

    def count(self) -> int:
        n = ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(n))
        return n.value

    def device(self, ordinal: int) -> dict[str, Any]:
        dev, name, uuid = ctypes.c_int(), ctypes.create_string_buffer(256), ctypes.create_string_buffer(16)
        total, sms = ctypes.c_size_t(), ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(dev), ordinal)
        self._call("cuDeviceGetName", name, 256, dev)
        # _v2 where the driver has it (CUDA 11.4+; its spelling of the same UUID for a whole GPU).
        self._call(
            "cuDeviceGetUuid_v2" if hasattr(self.lib, "cuDeviceGetUuid_v2") else "cuDeviceGetUuid", uuid, dev
        )
        self._call("cuDeviceTotalMem_v2", ctypes.byref(total), dev)
        self._call("cuDeviceGetAttribute", ctypes.byref(sms), ATTR_MULTIPROCESSOR_COUNT, dev)
        return {
            "uuid": _uuid(uuid.raw),
            "name": name.value.decode(),
            "total_mib": total.value // MIB,
            "sm_count": sms.value,
        }

    def context(self, ordinal: int) -> None:
        ctx = ctypes.c_void_p()
        self._call("cuDeviceGet", ctypes.byref(self.dev), ordinal)
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), self.dev)
        self._call("cuCtxSetCurrent", ctx)

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def context_sm_count(self) -> int | None:
        """SMs this context may use (under MPS the active thread percentage shows here); None where the
        driver lacks cuCtxGetExecAffinity."""
        if not hasattr(self.lib, "cuCtxGetExecAffinity"):
            return None
        p = _ExecAffinity()
        self._call("cuCtxGetExecAffinity", ctypes.byref(p), EXEC_AFFINITY_SM_COUNT)
        return int(p.sm_count)

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), nbytes)
        return int(ptr.value)

    def free(self, ptr: int) -> None:
        self._call("cuMemFree_v2", ptr)

    def touch(self, ptr: int, nbytes: int) -> None:
        self._call("cuMemsetD8_v2", ptr, 0x5A, nbytes)
        self._call("cuCtxSynchronize")


def _uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def load() -> Driver:
    if os.environ.get("GPUPACK_FAKE_CUDA") == "1":
        import fakedriver  # tests/gpu/fakecuda on PYTHONPATH in a rehearsal

        drv: Driver = fakedriver.FakeDriver(CudaError)
        return drv
    return LibCuda()


# --- where this process runs ---


def placement() -> dict[str, Any]:
    def link(p: str) -> str:
        try:
            return os.readlink(p)
        except OSError as exc:
            return f"unreadable: {exc.strerror}"

    cgroup = ""
    try:
        with open("/proc/self/cgroup") as f:
            cgroup = next((ln.strip()[3:] for ln in f if ln.startswith("0::")), "")
    except OSError:
        pass
    try:
        shm_dev: int | None = os.stat("/dev/shm").st_dev
    except OSError:
        shm_dev = None
    return {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "cgroup": cgroup,
        "ipc_ns": link("/proc/self/ns/ipc"),
        "mnt_ns": link("/proc/self/ns/mnt"),
        "shm_dev": shm_dev,
    }


def enter(cgroup: str, uid: int | None, gid: int | None) -> None:
    if cgroup:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write("0")
    if gid is not None:
        os.setgroups([])
        os.setgid(gid)
    if uid is not None:
        os.setuid(uid)


# --- modes ---


def probe(drv: Driver) -> dict[str, Any]:
    drv.init()
    return {"driver_version": drv.version(), "devices": [drv.device(i) for i in range(drv.count())]}


def meminfo(drv: Driver) -> dict[str, Any]:
    drv.init()
    dev = drv.device(0)
    drv.context(0)
    free, total = drv.mem_info()
    try:
        sms, sm_error = drv.context_sm_count(), ""
    except CudaError as exc:  # an answer too: the SM count per context is then unknown, not the memory
        sms, sm_error = None, exc.name
    return {
        "uuid": dev["uuid"],
        "device_total_mib": dev["total_mib"],
        "free_mib": free // MIB,
        "total_mib": total // MIB,
        "device_sm_count": dev["sm_count"],
        "context_sm_count": sms,
        "context_sm_error": sm_error,
    }


def alloc(drv: Driver, cap_mib: int, step_mib: int) -> dict[str, Any]:
    """Grow in `step_mib` chunks until refused, then halve the step down to 2 MiB to close the gap."""
    drv.init()
    drv.context(0)
    total, step, refusal = 0, step_mib, ""
    held: list[int] = []
    while step >= 2 and total < cap_mib:
        n = min(step, cap_mib - total)
        try:
            held.append(drv.alloc(n * MIB))
            total += n
        except CudaError as exc:
            refusal = exc.name
            step //= 2
    free, reported_total = drv.mem_info()
    for p in held:
        drv.free(p)
    return {
        "max_mib": total,
        "capped": total >= cap_mib,
        "refusal": refusal,
        "free_mib_at_max": free // MIB,
        "total_mib": reported_total // MIB,
    }


def _ready(drv: Driver, mib: int, emit: Any) -> int:
    """A context holding `mib` MiB, touched once; says so on stdout. The allocation's pointer."""
    drv.init()
    drv.context(0)
    ptr = drv.alloc(mib * MIB)
    drv.touch(ptr, mib * MIB)
    emit({"ready": True, "pid": os.getpid(), "held_mib": mib})
    return ptr


def hold(drv: Driver, mib: int, seconds: float, emit: Any) -> dict[str, Any]:
    ptr = _ready(drv, mib, emit)
    deadline, touches, failure = time.monotonic() + seconds, 0, ""
    while time.monotonic() < deadline:
        try:
            drv.touch(ptr, mib * MIB)
            touches += 1
        except CudaError as exc:  # e.g. CUDA_ERROR_MPS_CLIENT_TERMINATED once MPS evicted us
            failure = exc.name
            break
        ready, _, _ = select.select([sys.stdin], [], [], 0.2)
        if ready and not sys.stdin.readline():  # the suite closed our stdin: done
            break
    return {"touches": touches, "failure": failure}


def busy(drv: Driver, mib: int, seconds: float, emit: Any) -> dict[str, Any]:
    """Work in flight for `seconds`: memsets of `mib` MiB back to back, each synchronized, no pause between
    (a signal then lands while the GPU runs this context's work); then exit normally."""
    ptr = _ready(drv, mib, emit)
    deadline, rounds, failure = time.monotonic() + seconds, 0, ""
    while time.monotonic() < deadline:
        try:
            drv.touch(ptr, mib * MIB)
            rounds += 1
        except (
            CudaError
        ) as exc:  # cudaErrorIllegalAddress when a neighbour died busy; terminated; RPC failure
            failure = exc.name
            break
    return {"rounds": rounds, "failure": failure, "done": not failure}


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("probe", "meminfo", "alloc", "hold", "busy"))
    ap.add_argument("--cap-mib", type=int, default=1 << 22, help="alloc: stop once this much fits")
    ap.add_argument("--step-mib", type=int, default=1024, help="alloc: first chunk size")
    ap.add_argument("--mib", type=int, default=1024, help="hold: MiB to allocate")
    ap.add_argument("--seconds", type=float, default=120.0, help="hold: longest time to hold")
    ap.add_argument("--cgroup", default="", help="cgroup v2 directory to join before CUDA starts")
    ap.add_argument("--uid", type=int, default=None, help="user to become before CUDA starts")
    ap.add_argument("--gid", type=int, default=None, help="group to become before CUDA starts")
    args = ap.parse_args(argv)
    try:
        drv = load()  # before dropping to another uid: our files need not be readable by it
    except OSError as exc:  # no libcuda.so.1
        _emit(placement() | {"error": f"{type(exc).__name__}: {exc}", "cuda_error": ""})
        return 3
    try:
        enter(args.cgroup, args.uid, args.gid)
    except OSError as exc:
        _emit({"error": f"could not enter cgroup {args.cgroup!r} / uid {args.uid}: {exc}", **placement()})
        return 3
    head = placement()
    try:
        if args.mode == "probe":
            body = probe(drv)
        elif args.mode == "meminfo":
            body = meminfo(drv)
        elif args.mode == "alloc":
            body = alloc(drv, args.cap_mib, args.step_mib)
        elif args.mode == "busy":
            body = busy(drv, args.mib, args.seconds, _emit)
        else:
            body = hold(drv, args.mib, args.seconds, _emit)
    except CudaError as exc:
        _emit(head | {"error": str(exc), "cuda_error": exc.name})
        return 3
    _emit(head | body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
