#!/usr/bin/env python3
"""A stand-in CUDA process for simulated GPUs: it allocates device memory through the agent's simulated
allocator (agent/simgpu/simalloc.py) instead of a driver. STAND-IN: no GPU, no CUDA. Standard library only,
so a test can mount it into any image with python3.

  gpu_alloc.py [--socket PATH] [--hold] COMMAND...
                                            each COMMAND (quoted, e.g. "alloc GPU-... 4096", "limits",
                                            "whoami") sent in turn on one connection (one CUDA context:
                                            allocations are held until it ends); each answer line printed
                                            as `<n>: <answer>`; --hold then keeps the context (and its
                                            memory) until the process is ended
Default socket: /run/gpupack/sim-gpu/alloc.sock (where the node side mounts it).

Like a CUDA process, it is an MPS client wherever its CUDA_MPS_PIPE_DIRECTORY has a live daemon: it attaches
to the (stand-in) daemon for its whole life, so the daemon lists it (get_client_list) by its pid; with no
daemon there it runs as a plain process (docs/node-side.md, "MPS as measured": a direct context). Its first
`alloc` on a GPU opens its context there, which the GPU's compute mode may refuse: a plain process on a GPU in
EXCLUSIVE_PROCESS gets `refused CUDA_ERROR_DEVICE_UNAVAILABLE` while an MPS server runs (measured), or while
another plain process holds it (agent.simgpu.simulated.SimulatedNvml.context_refusal).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys

DEFAULT = "/run/gpupack/sim-gpu/alloc.sock"


def mps_client() -> socket.socket | None:
    """Attached to the MPS daemon of CUDA_MPS_PIPE_DIRECTORY, as CUDA would be (None: a plain process)."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not pipe:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.settimeout(10)
        conn.connect(os.path.join(pipe, "control"))
        conn.send(b"gpupack-standin-client\n")  # the stand-in daemon's client hello
        if not conn.recv(65536):
            raise OSError("no server")
    except OSError:
        conn.close()
        return None
    return conn


def main(argv: list[str]) -> int:
    path = DEFAULT
    if argv[:1] == ["--socket"]:
        path, argv = argv[1], argv[2:]
    hold = argv[:1] == ["--hold"]
    argv = argv[1:] if hold else argv
    client = mps_client()
    with contextlib.ExitStack() as stack, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        if client is not None:
            stack.enter_context(client)
        try:
            conn.connect(path)
        except OSError as exc:
            print(f"0: no allocator at {path} ({exc})")
            return 3
        reader = conn.makefile("r")
        for n, command in enumerate(argv, 1):
            conn.sendall(command.encode() + b"\n")
            print(f"{n}: {reader.readline().rstrip()}", flush=True)
        if hold:
            print("holding", flush=True)
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
