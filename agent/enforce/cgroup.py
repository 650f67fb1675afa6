"""Process → pod: parse /proc/<pid>/cgroup (v1 and v2, systemd and cgroupfs drivers) for the pod UID."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# cgroupfs driver: .../kubepods[/burstable|/besteffort]/pod<uid>/<container id>
_CGROUPFS = re.compile(r"/kubepods(?:/[a-z]+)?/pod(?P<uid>[0-9a-fA-F-]{36})(?:/(?P<cid>[0-9a-f]{64}))?")
# systemd driver: kubepods[-<qos>]-pod<uid with _ for ->.slice[/<runtime>-<container id>.scope]
_SYSTEMD = re.compile(
    r"kubepods(?:-[a-z]+)?-pod(?P<uid>[0-9a-fA-F_]{36})\.slice"
    r"(?:/(?:[a-z-]+-)?(?P<cid>[0-9a-f]{64})\.scope)?"
)


@dataclass(frozen=True, slots=True)
class PodRef:
    pod_uid: str
    container_id: str  # the runtime's container ID, "" when the path stops at the pod (e.g. the sandbox)


def parse_line(line: str) -> PodRef | None:
    """The pod a /proc/<pid>/cgroup line points into, or None (host process, or not a kubepods path)."""
    parts = line.strip().split(":", 2)
    if len(parts) != 3:
        return None
    path = parts[2]
    m = _SYSTEMD.search(path)
    if m:
        return PodRef(m["uid"].replace("_", "-").lower(), m["cid"] or "")
    m = _CGROUPFS.search(path)
    if m:
        return PodRef(m["uid"].lower(), m["cid"] or "")
    return None


def parse(text: str) -> PodRef | None:
    """The pod of a whole /proc/<pid>/cgroup file: v2's single "0::" line, or any v1 hierarchy line."""
    best: PodRef | None = None
    for line in text.splitlines():
        ref = parse_line(line)
        if ref is not None and (best is None or (ref.container_id and not best.container_id)):
            best = ref
    return best


class ProcResolver:
    """Reads /proc/<pid>/cgroup under a (host) proc root; the agent mounts the host's /proc there."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root

    def pids(self) -> list[int]:
        """Every process under the proc root (the host's, in the agent's pod)."""
        try:
            return [int(e.name) for e in self.proc_root.iterdir() if e.name.isdigit()]
        except OSError:
            return []

    def environ(self, pid: int) -> bytes | None:
        """/proc/<pid>/environ; None once the process is gone or when it may not be read (another uid's
        process needs CAP_SYS_PTRACE)."""
        try:
            return (self.proc_root / str(pid) / "environ").read_bytes()
        except OSError:
            return None

    def pod_of(self, pid: int) -> PodRef | None:
        try:
            return parse((self.proc_root / str(pid) / "cgroup").read_text())
        except OSError:  # the process exited, or /proc is not the host's
            return None


class Listed(Protocol):
    """A simulated GPU set (agent.simgpu.simulated): the processes its file lists, and their pods."""

    def owners(self) -> Mapping[int, object]: ...
    def pod_of(self, pid: int) -> PodRef | None: ...


class SimulatedOrHost:
    """pid → pod for simulated GPUs: the file's own answer for a process it lists (those pids are made up),
    the host's /proc for a real process (one the simulated allocator serves)."""

    def __init__(self, sim: Listed, host: ProcResolver) -> None:
        self.sim = sim
        self.host = host

    def pod_of(self, pid: int) -> PodRef | None:
        return self.sim.pod_of(pid) if pid in self.sim.owners() else self.host.pod_of(pid)
