"""What each GPU enforces between the pods sharing it, decided from facts the agent read (pure).

The agent reports the answer per GPU in its GPUNode (`status.gpus[].isolation`); placement keeps pods
off GPUs whose mode or level does not suit them (app.core.placement.fit.mode_admits). The levels claim only
what a pod cannot escape by its own doing: a limit a process can unset from its env is "client-env", not
more. docs/node-side.md ("Isolation per GPU") is the user's table of the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.enforce import memlimits
from agent.nvml.base import ComputeMode
from app.core.isolation import ComputeEnforcement, MemoryEnforcement, Sharing, compute_enforcement
from app.kube.gpunode import GpuIsolation

# NVML's compute modes as the GPUNode writes them (short, for `kubectl get`).
MODE_NAMES = {
    ComputeMode.DEFAULT: "Default",
    ComputeMode.EXCLUSIVE_PROCESS: "ExclusiveProcess",
    ComputeMode.PROHIBITED: "Prohibited",
}


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What holds for every GPU of the node: the agent's settings and the node side's abilities."""

    daemon_memory_cap: bool = False  # GpuFacts.daemon_memory_cap
    # The node side sets per-cgroup limits on every GPU container wherever the driver can take them (the
    # handler answers, the NVML binding has the calls, cgroup v2 is where the driver reads it:
    # agent.enforce.memlimits.host_capability). A GPU claims `per-cgroup` only where its driver is r615+ as
    # well.
    per_cgroup_memory: bool = False

    def of(self, compute_mode: ComputeMode | None, mps_serving: bool, driver_version: str) -> GpuFacts:
        per_cgroup = self.per_cgroup_memory and memlimits.driver_supports(driver_version)
        return GpuFacts(compute_mode, mps_serving, self.daemon_memory_cap, per_cgroup, driver_version)


NO_NODE_FACTS = NodeFacts()  # no daemon cap, no per-cgroup limits


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What the agent knows of one whole (non-MIG) GPU and the node side that serves it."""

    compute_mode: ComputeMode | None  # NVML's reading; None: it could not tell
    # The node's MPS control daemon answers and has the agent's defaults (MpsState.RUNNING).
    mps_serving: bool
    # The daemon caps every client's pinned memory (agent.mps.defaultPinnedMemoryLimitMiB is set): a client
    # cannot raise its limit past it by editing its env.
    daemon_memory_cap: bool = False
    # The node side sets each GPU container's own memory limit through the driver (NVML r615+
    # nvmlDeviceSetMemoryLimits_v1 on the container's cgroup v2): no process in it can exceed it.
    per_cgroup_memory: bool = False
    driver_version: str = ""


def decide(facts: GpuFacts) -> GpuIsolation:
    """The GPU's sharing mode and enforcement levels.

    - sharing: the daemon serving + EXCLUSIVE_PROCESS → exclusive (MPS clients only); + DEFAULT → shared
      (MPS clients and time-sliced processes; an unreadable mode is taken as DEFAULT, the weaker claim);
      + PROHIBITED → closed. No daemon: DEFAULT (or unreadable) → off; EXCLUSIVE_PROCESS or PROHIBITED →
      closed (one process at a time, or none).
    - memory: per-cgroup where the node side sets each container's limit; else, under MPS, the daemon's
      cap where the GPU is exclusive (a process can neither raise its limit nor leave MPS) and the daemon
      has one, otherwise the client's env; without MPS, none.
    - compute: MPS thread percentage only where the GPU is exclusive (app.core.isolation.compute_enforcement).
    """
    mode = facts.compute_mode
    if mode is ComputeMode.PROHIBITED:
        sharing = Sharing.CLOSED
    elif facts.mps_serving:
        sharing = Sharing.EXCLUSIVE if mode is ComputeMode.EXCLUSIVE_PROCESS else Sharing.SHARED
    else:
        sharing = Sharing.OFF if mode in (None, ComputeMode.DEFAULT) else Sharing.CLOSED
    if facts.per_cgroup_memory:
        memory = MemoryEnforcement.PER_CGROUP
    elif sharing is Sharing.EXCLUSIVE and facts.daemon_memory_cap:
        memory = MemoryEnforcement.DAEMON_DEFAULT
    elif sharing in (Sharing.EXCLUSIVE, Sharing.SHARED):
        memory = MemoryEnforcement.CLIENT_ENV
    else:
        memory = MemoryEnforcement.NONE
    return GpuIsolation(
        driver_version=facts.driver_version,
        compute_mode=MODE_NAMES.get(mode, "") if mode else "",
        mps_mode=sharing,
        memory=memory,
        compute=compute_enforcement(sharing),
    )


def weakest(levels: list[GpuIsolation]) -> tuple[str, str]:
    """(memory, compute) of the weakest of `levels`: what every pod on the node gets ("" where none)."""
    if not levels:
        return "", ""
    memory = min((g.memory for g in levels), key=lambda m: m.rank)
    compute = ComputeEnforcement.TIME_SLICE
    if all(g.compute is ComputeEnforcement.MPS_PERCENTAGE for g in levels):
        compute = ComputeEnforcement.MPS_PERCENTAGE
    return memory.value, compute.value
