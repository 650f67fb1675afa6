"""A CUDA client for the GPU suite, run as its own process: torch if importable, else CuPy.

Standalone on purpose (imports neither gpupack nor pytest): the suite starts it with the env a pod would
get and reads one JSON object from its stdout.

  workload.py probe                      visible devices: count, UUIDs, names, memory
  workload.py alloc [--cap-mib N]        allocate until CUDA refuses; report the most that fit
  workload.py matmul --seconds S [--start-at T]   saturating fp16 matmul loop; report iterations/s
  workload.py hold --mib M [--seconds S] allocate M MiB, print {"ready": ...}, run matmuls until stdin closes

Every mode prints exactly one JSON line (hold prints its "ready" line first); errors print
{"error": ...} and exit 3, so the suite can tell "no CUDA" from a wrong answer.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
from typing import Any

MIB = 1 << 20


class Cuda:
    """The few CUDA operations the modes need, over torch or CuPy."""

    def __init__(self) -> None:
        try:
            import torch

            self.lib, self.version, self.t = "torch", str(torch.__version__), torch
            self.cp: Any = None
        except ImportError:
            import cupy

            cupy.cuda.set_allocator(None)  # every allocation is a real cudaMalloc, no pool hiding OOM
            self.lib, self.version, self.cp = "cupy", str(cupy.__version__), cupy
            self.t = None

    def devices(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.t is not None:
            for i in range(self.t.cuda.device_count()):
                p = self.t.cuda.get_device_properties(i)
                out.append({"uuid": str(p.uuid), "name": p.name, "total_mib": int(p.total_memory) // MIB})
            return out
        rt = self.cp.cuda.runtime
        for i in range(rt.getDeviceCount()):
            p = rt.getDeviceProperties(i)
            raw = p["uuid"]
            uuid = raw.hex() if isinstance(raw, bytes | bytearray) else str(raw)
            name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
            out.append({"uuid": uuid, "name": name, "total_mib": int(p["totalGlobalMem"]) // MIB})
        return out

    def empty(self, mib: int) -> Any:
        if self.t is not None:
            return self.t.empty(mib * MIB, dtype=self.t.uint8, device="cuda")
        return self.cp.empty(mib * MIB, dtype=self.cp.uint8)

    def matrices(self, n: int) -> tuple[Any, Any]:
        if self.t is not None:
            return (
                self.t.randn(n, n, device="cuda", dtype=self.t.float16),
                self.t.randn(n, n, device="cuda", dtype=self.t.float16),
            )
        return (
            self.cp.random.standard_normal((n, n), dtype=self.cp.float32).astype(self.cp.float16),
            self.cp.random.standard_normal((n, n), dtype=self.cp.float32).astype(self.cp.float16),
        )

    def matmul(self, a: Any, b: Any) -> Any:
        return a @ b

    def sync(self) -> None:
        if self.t is not None:
            self.t.cuda.synchronize()
        else:
            self.cp.cuda.Device().synchronize()

    def free_cache(self) -> None:
        if self.t is not None:
            self.t.cuda.empty_cache()


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def probe(cuda: Cuda) -> dict[str, Any]:
    return {"devices": cuda.devices()}


def alloc(cuda: Cuda, cap_mib: int, step_mib: int) -> dict[str, Any]:
    """Grow in `step_mib` chunks until refused, then halve the step down to 2 MiB to close the gap."""
    held: list[Any] = []
    total, last_error = 0, ""
    step = step_mib
    while step >= 2 and total < cap_mib:
        try:
            held.append(cuda.empty(min(step, cap_mib - total)))
            total += min(step, cap_mib - total)
        except (
            Exception
        ) as exc:  # torch.OutOfMemoryError / RuntimeError, cupy OutOfMemoryError / CUDARuntimeError
            last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            cuda.free_cache()
            step //= 2
    cuda.sync()
    return {"max_mib": total, "capped": total >= cap_mib, "refusal": last_error}


def matmul(cuda: Cuda, seconds: float, size: int, start_at: float) -> dict[str, Any]:
    a, b = cuda.matrices(size)
    for _ in range(3):  # warm-up: kernel selection, clocks
        cuda.matmul(a, b)
    cuda.sync()
    late = start_at > 0 and time.time() > start_at
    if start_at > 0:
        time.sleep(max(0.0, start_at - time.time()))
    iters, t0 = 0, time.perf_counter()
    while True:
        for _ in range(10):
            cuda.matmul(a, b)
        cuda.sync()
        iters += 10
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
    flop = 2.0 * size**3 * iters
    return {
        "iterations": iters,
        "seconds": round(elapsed, 4),
        "iters_per_s": round(iters / elapsed, 3),
        "tflops": round(flop / elapsed / 1e12, 3),
        "size": size,
        "late_start": late,
    }


def hold(cuda: Cuda, mib: int, seconds: float, size: int) -> dict[str, Any]:
    buf = cuda.empty(mib)
    a, b = cuda.matrices(size)
    cuda.sync()
    _emit({"ready": True, "pid": os.getpid(), "held_mib": mib})
    deadline = time.monotonic() + seconds
    iters = 0
    while time.monotonic() < deadline:
        for _ in range(10):
            cuda.matmul(a, b)
        cuda.sync()
        iters += 10
        ready, _, _ = select.select([sys.stdin], [], [], 0)
        if ready and not sys.stdin.readline():  # the suite closed our stdin: done
            break
    del buf
    return {"iterations": iters}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("probe", "alloc", "matmul", "hold"))
    ap.add_argument("--cap-mib", type=int, default=1 << 20, help="alloc: stop once this much fits")
    ap.add_argument("--step-mib", type=int, default=1024, help="alloc: first chunk size")
    ap.add_argument("--seconds", type=float, default=5.0, help="matmul/hold: how long to run")
    ap.add_argument("--size", type=int, default=8192, help="matmul/hold: square matrix size (fp16)")
    ap.add_argument("--start-at", type=float, default=0.0, help="matmul: epoch second to start timing")
    ap.add_argument("--mib", type=int, default=1024, help="hold: MiB to allocate")
    args = ap.parse_args(argv)
    try:
        cuda = Cuda()
    except ImportError as exc:
        _emit({"error": f"neither torch nor cupy is importable: {exc}"})
        return 3
    head = {"lib": cuda.lib, "lib_version": cuda.version, "pid": os.getpid()}
    try:
        if args.mode == "probe":
            body = probe(cuda)
        elif args.mode == "alloc":
            body = alloc(cuda, args.cap_mib, args.step_mib)
        elif args.mode == "matmul":
            body = matmul(cuda, args.seconds, args.size, args.start_at)
        else:
            body = hold(cuda, args.mib, args.seconds, args.size)
    except Exception as exc:  # a CUDA init failure (e.g. MPS refused the client) is an answer too
        _emit(head | {"error": f"{type(exc).__name__}: {exc}"[:1000]})
        return 3
    _emit(head | body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
