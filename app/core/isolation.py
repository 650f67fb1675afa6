"""What a shared GPU enforces between the pods on it: the words GPUNode, placement and pods share.

Each GPU has a *sharing mode* (what kind of pod may share it, from its NVML compute mode and whether the
node's MPS daemon serves it) and two enforcement levels (what keeps one pod inside its share when the
pod's own processes misbehave). The agent decides them from facts (agent.report.isolation); placement only
compares them with what the pod asks (app.core.placement.fit). docs/node-side.md explains each value.
"""

from __future__ import annotations

from enum import StrEnum


class Sharing(StrEnum):
    """What may share a GPU: the GPU's compute mode with the MPS daemon's state."""

    UNKNOWN = ""  # not reported (the simulator, an agent or CRD from before modes): every kind fits
    # EXCLUSIVE_PROCESS and the daemon serves: only MPS clients reach the GPU; a process without the
    # pipe directory is refused, so `isolation: none` pods do not fit (their processes would fail).
    EXCLUSIVE = "exclusive"
    # DEFAULT and the daemon serves: MPS clients and time-sliced processes together; nothing stops a
    # process from leaving MPS by dropping its pipe directory.
    SHARED = "shared"
    OFF = "off"  # DEFAULT, no daemon serves: time-slicing only (`isolation: mps` pods do not fit)
    # EXCLUSIVE_PROCESS (or PROHIBITED) and no daemon serves: one process at a time, or none; no new share.
    CLOSED = "closed"


class MemoryEnforcement(StrEnum):
    """What holds a pod to its GPU memory share, weakest first (`rank`)."""

    NONE = "none"  # nothing: a pod may allocate the whole GPU's memory
    CLIENT_ENV = "client-env"  # the MPS client's own env; a process that unsets it (or leaves MPS) escapes
    # The MPS daemon's default pinned-memory cap, which a client cannot raise and (EXCLUSIVE_PROCESS) not
    # bypass: one cap for every pod on the GPU, not each pod's own share.
    DAEMON_DEFAULT = "daemon-default"
    PER_CGROUP = "per-cgroup"  # the driver's per-cgroup limit (NVML r615+, cgroup v2): each container's own

    @property
    def rank(self) -> int:
        return _MEMORY_ORDER.index(self)


_MEMORY_ORDER = tuple(MemoryEnforcement)


class ComputeEnforcement(StrEnum):
    """What holds a pod to its compute share."""

    TIME_SLICE = "time-slice"  # the driver's time-slicing: no share is enforced
    MPS_PERCENTAGE = "mps-percentage"  # MPS active-thread percentage (the client's env, capped by the daemon)


def compute_enforcement(sharing: Sharing) -> ComputeEnforcement:
    """MPS thread percentages hold only where the GPU is exclusive: elsewhere a process can time-slice
    beside the MPS server, so nothing holds it to a share."""
    return (
        ComputeEnforcement.MPS_PERCENTAGE if sharing is Sharing.EXCLUSIVE else ComputeEnforcement.TIME_SLICE
    )


def memory_levels() -> str:
    """The memory levels weakest first, quoted, for messages: "'none', 'client-env', ..."."""
    return ", ".join(f"'{m.value}'" for m in _MEMORY_ORDER)
