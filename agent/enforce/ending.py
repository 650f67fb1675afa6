"""Ending one host process for the watchdog (agent.enforce.watchdog): an MPS client through the daemon first,
then SIGKILL by its host pid.

Measured (docs/node-side.md, "MPS as measured"): a busy MPS client killed outright makes every other client
of its server fail with cudaErrorIllegalAddress; ended first with `terminate_client`, it fails alone. So a
process the daemon lists as a client is drained (agent.mpsdaemon.drain) before the signal. The signal goes
through a pidfd opened before the pid is checked again, so a pid that was reused between NVML's list and the
signal is never hit: the process behind the pidfd is the one whose cgroup was read.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from agent.enforce.cgroup import PodRef, ProcResolver
from agent.mpsdaemon import drain as drains

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Ended:
    """What ending one process did: `signalled` once SIGKILL was sent; `note` says what else happened
    (drained through the daemon, or why nothing was sent); `ran_s` how long it had run (None: unknown)."""

    signalled: bool
    note: str
    ran_s: float | None = None


def nothing_listens(control: Path, timeout_s: float = 1.0) -> bool:
    """Whether no MPS control daemon listens on `control` (no socket, or a connection refused: a daemon that
    died leaves its socket behind). False where one accepts, and where it cannot be told (a timeout)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:  # measured: SOCK_SEQPACKET
        s.settimeout(timeout_s)
        try:
            s.connect(str(control))
        except OSError as exc:
            return exc.errno in (errno.ENOENT, errno.ECONNREFUSED)
    return False


class HostProcesses:
    """The host's processes under `proc_root` (the host's /proc; the agent needs hostPID to signal them)."""

    def __init__(
        self, proc_root: Path, mps_clients: drains.ClientLists | None = None, drain_timeout_s: float = 0.0
    ) -> None:
        """`mps_clients`: the node's listing of the daemon's clients, shared with the runtime handler's stops
        (None: no MPS, nothing is drained)."""
        self.proc_root = proc_root
        self.resolver = ProcResolver(proc_root)
        self.mps_clients = mps_clients
        self.drain_timeout_s = drain_timeout_s

    def comm(self, pid: int) -> str:
        """/proc/<pid>/comm ("" once gone); the kernel cuts it at 15 characters."""
        try:
            return (self.proc_root / str(pid) / "comm").read_text().strip()
        except OSError:
            return ""

    def host_pid_namespace(self) -> bool:
        """Whether our pids are the host's: `proc_root/self` names this process by our own pid."""
        try:
            return int(os.readlink(self.proc_root / "self")) == os.getpid()
        except (OSError, ValueError):
            return False

    def ran_s(self, pid: int) -> float | None:
        """Seconds since the process started (/proc/<pid>/stat starttime against CLOCK_BOOTTIME)."""
        try:
            stat = (self.proc_root / str(pid) / "stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) < 20 or not fields[19].isdigit():
            return None
        return time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / _CLOCK_TICKS

    def end(self, pid: int, ref: PodRef | None, mps_client: bool) -> Ended:
        """End `pid` if it still runs in `ref`'s pod (None: in no pod); a client is drained first."""
        if not self.host_pid_namespace():
            return Ended(False, "not ended: the agent does not share the host's pid namespace (hostPID)")
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return Ended(False, "already gone")
        except OSError as exc:
            return Ended(False, f"not ended: pidfd_open: {exc}")
        try:
            if self.resolver.pod_of(pid) != ref:
                return Ended(False, "already gone (its pid now names another process)")
            ran = self.ran_s(pid)
            note = ""
            if mps_client and self.mps_clients is not None and self.drain_timeout_s > 0:
                done = drains.drain(self.mps_clients, [pid], self.drain_timeout_s)
                note = "ended through the MPS daemon first; " if done.complete else f"{done.problem}; "
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                return Ended(False, note + "gone before the signal", ran)
            except OSError as exc:
                return Ended(False, note + f"not ended: {exc}", ran)
            return Ended(True, note + "ended with SIGKILL", ran)
        finally:
            os.close(fd)
