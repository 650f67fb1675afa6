"""The simulated GPU's allocator: what a containerized CUDA process meets when it allocates device memory.

Only with simulated GPUs (`--sim` and `--sim-allocator <socket>`). A process in a GPU container (the
node side mounts the socket's directory there) connects and sends one command a line (one answer line each):

  whoami               -> `pid <pid> cgroup <cgroup v2 dir>` as the allocator identified the caller
  limits               -> per GPU, `; `-separated: `<uuid> soft=<B> hard=<B> used=<B> set_boottime_ns=<N>`
                          (nvmlDeviceGetMemoryLimits_v1 for the caller's cgroup; `unlimited` where none)
  alloc <uuid> <MiB>   -> `ok used=<B>` or `refused <CUDA error>: <why>`; held until the connection closes.
                          A connection's first alloc on a GPU opens its context there, which the GPU's
                          compute mode may refuse (SimulatedNvml.context_refusal: a plain process on a GPU
                          in EXCLUSIVE_PROCESS while an MPS server runs gets CUDA_ERROR_DEVICE_UNAVAILABLE)

The caller is identified as NVIDIA's memory accounting identifies an MPS client: by the pid in its socket's
peer credentials (SO_PEERCRED), then /proc/<pid>/cgroup. The kernel gives that pid as seen from the
allocator's pid namespace: outside the host's (an agent pod without hostPID) a containerized caller's pid
is 0, and the allocator does what MPS memacct does then: logs "failed to register client pid 0" and lets
the allocation through unlimited. That failure is reproduced, not hidden: the chart gives the agent
hostPID where this allocator serves.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from pathlib import Path

from agent.enforce import memlimits
from agent.mpsdaemon.mpscontrol import Control
from agent.nvml.base import MEMORY_LIMIT_MAX, NvmlError
from agent.simgpu.simlimits import Refused
from agent.simgpu.simulated import MpsView, SimulatedNvml
from app.core import log

_log = log.get("gpupack.agent.simalloc")
MIB = 1 << 20


def peer_pid(conn: socket.socket) -> int:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", raw)
    return int(pid)


def mps_view(control: Control | None) -> MpsView:
    """The node's MPS servers and their clients, from its daemon (none when no daemon answers)."""
    servers = control.server_list() if control is not None else []
    if isinstance(servers, str) or control is None:
        return MpsView()
    clients: set[int] = set()
    for server in servers:
        listed = control.client_list(server)
        clients |= set(listed) if isinstance(listed, list) else set()
    return MpsView(tuple(servers), frozenset(clients))


class Allocator:
    """Answers callers over `socket_path`; `proc_root` is the host's /proc; `cgroup_root` where cgroup v2
    is mounted (the simulated NVML's root); `mps` reads the node's MPS servers when a context opens."""

    def __init__(
        self,
        nvml: SimulatedNvml,
        socket_path: Path,
        proc_root: Path,
        cgroup_root: str,
        mps: Callable[[], MpsView] = MpsView,
    ) -> None:
        self.nvml = nvml
        self.mps = mps
        self.socket_path = socket_path
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root.rstrip("/")
        self._ids = itertools.count(1)
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    def cgroup_of(self, pid: int) -> str:
        """The caller's cgroup v2 directory ("" when it cannot be told: pid 0, or the process is gone)."""
        if pid <= 0:
            return ""
        try:
            line = memlimits.v2_line((self.proc_root / str(pid) / "cgroup").read_text())
        except OSError:
            return ""
        return "" if line is None else self.cgroup_root + line

    def answer(
        self, words: list[str], pid: int, cgroup: str, holder: str, opened: set[str] | None = None
    ) -> str:
        """One command's answer; `opened`: the GPUs this connection holds a context on (updated)."""
        if words == ["whoami"]:
            return f"pid {pid} cgroup {cgroup or '-'}"
        if words == ["limits"]:
            return "; ".join(self._limits(cgroup)) or "no GPUs"
        if len(words) == 3 and words[0] == "alloc" and words[2].isdigit():
            uuid, mib = words[1], int(words[2])
            if opened is not None and uuid not in opened:
                refused = self.nvml.context_refusal(uuid, pid, self.mps())
                if refused is not None:
                    return f"refused {refused.reason}"
                opened.add(uuid)
            # Unregistered (pid 0): the allocation is charged nowhere, as with MPS memacct.
            where = cgroup or self.cgroup_root + "/(unregistered)"
            got = self.nvml.allocate(uuid, where, holder, mib * MIB, pid=pid)
            return f"refused {got.reason}" if isinstance(got, Refused) else f"ok used={got}"
        return "error: commands are whoami, limits, alloc <uuid> <MiB>"

    def _limits(self, cgroup: str) -> list[str]:
        out = []
        for i in range(self.nvml.device_count()):
            uuid = self.nvml.uuid(i)
            if not cgroup:
                out.append(f"{uuid} unregistered")
                continue
            try:
                got = self.nvml.memory_limits(i, cgroup)
            except NvmlError as exc:
                out.append(f"{uuid} error {exc.code.value}")
                continue
            hard = "unlimited" if got.hard_bytes == MEMORY_LIMIT_MAX else str(got.hard_bytes)
            stamp = self.nvml.limits.limited(uuid).get(cgroup, {}).get("set_boottime_ns", 0)
            used = got.current_used_bytes
            out.append(f"{uuid} soft={got.soft_bytes} hard={hard} used={used} set_boottime_ns={stamp}")
        return out

    def serve(self, conn: socket.socket) -> None:
        pid = peer_pid(conn)
        cgroup = self.cgroup_of(pid)
        if not cgroup:
            _log.warning(
                "[memacct] failed to register client pid %d: its allocations are not limited", pid,
                extra={"pid": pid},
            )  # fmt: skip
        holder = f"{os.getpid()}:{next(self._ids)}"
        opened: set[str] = set()
        try:
            with conn.makefile("rwb", buffering=0) as f:
                for raw in f:
                    words = raw.decode(errors="replace").split()
                    f.write(self.answer(words, pid, cgroup, holder, opened).encode() + b"\n")
        except OSError:
            pass
        finally:
            for uuid in opened:  # the process's memory goes with its context
                self.nvml.limits.release(uuid, holder)

    def start(self) -> None:
        for i in range(self.nvml.device_count()):
            self.nvml.limits.release_all(self.nvml.uuid(i))  # no earlier connection holds memory now
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer.serve(self.request)

        self._server = socketserver.ThreadingUnixStreamServer(str(self.socket_path), Handler)
        self._server.daemon_threads = True
        os.chmod(self.socket_path, 0o666)  # containers of any uid allocate
        with contextlib.suppress(OSError):
            os.chmod(self.socket_path.parent, 0o755)
        self._thread = threading.Thread(target=self._server.serve_forever, name="sim-allocator", daemon=True)
        self._thread.start()
        _log.info("simulated GPU allocator listening", extra={"socket": str(self.socket_path)})

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self.socket_path.unlink(missing_ok=True)
