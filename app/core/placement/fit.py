"""Whether a node and its GPUs can take a demand, and the human-readable reason when they cannot."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeGuard, runtime_checkable

from app.core import names
from app.core.errors import ForeignUse, PlacementReason, Shortfall
from app.core.isolation import MemoryEnforcement, Sharing
from app.core.model import MILLI_PER_GPU, Demand, Gpu, Node
from app.core.placement.base import Policy

# Foreign processes (outside any gpupack pod) grow and shrink as they run; where a GPU has any, keep this
# much head-room on top of what they use now. A GPU with no foreign usage needs none: gpupack pods are
# held to their reservations, so a whole-GPU pod fits an idle GPU exactly.
FOREIGN_MARGIN_MIB = 256


def memory_room(gpu: Gpu, margin_mib: int = FOREIGN_MARGIN_MIB) -> int:
    """MiB a new reservation may take: total - gpupack reservations - foreign usage - margin (if foreign)."""
    return gpu.memory_free_mib - (margin_mib if gpu.foreign_mib > 0 else 0)


def gpu_fits(gpu: Gpu, demand: Demand, margin_mib: int = FOREIGN_MARGIN_MIB) -> bool:
    """One GPU can take one device's worth of `demand` (model, health, milli and memory room).

    Array forms of a policy's filter (`fragaware_array`) compute these same checks from numbers on the GPUs
    `array_modelled` admits: a rule added here that reads anything else must keep those GPUs out there.
    """
    if not gpu.healthy or (demand.models and gpu.model not in demand.models):
        return False
    # `mode_admits`, asked only where it can say no (this runs per GPU per node per demand)
    if (
        gpu.sharing is _CLOSED or demand.timeslice or demand.memory_enforcement is not _ANY_MEMORY
    ) and not mode_admits(gpu, demand):
        return False
    # A share of a whole GPU (the usual case) targets every whole GPU; MIG asks Demand.targets.
    if (demand.mig or demand.mig_profile or gpu.mig_profile) and not demand.targets(gpu):
        return False
    milli, mib = demand.on(gpu.memory_mib)
    if milli + gpu.milli_used > MILLI_PER_GPU:
        return False
    foreign = gpu.foreign_mib  # memory_room, inlined: this runs per GPU per node per demand
    return mib <= gpu.memory_mib - gpu.memory_used_mib - foreign - (margin_mib if foreign > 0 else 0)


_ANY_MEMORY = MemoryEnforcement.NONE
_CLOSED = Sharing.CLOSED


def mode_admits(gpu: Gpu, demand: Demand) -> bool:
    """Whether `gpu`'s sharing mode and memory enforcement suit `demand` (app.core.isolation).

    Not on a CLOSED GPU (EXCLUSIVE_PROCESS with no MPS daemon: one process at a time); an `isolation:
    none` pod not on an EXCLUSIVE GPU (its processes are no MPS clients, the GPU refuses them); a pod
    that requires a memory enforcement level only on GPUs that give at least it. A MIG device always
    suits: it is its own hardware partition. `isolation: mps` against a GPU without MPS is the node's
    rule (`Node.mps`), which every GPU of such a node shares.
    """
    if gpu.mig_profile:
        return True
    sharing = gpu.sharing
    if sharing is Sharing.CLOSED or (demand.timeslice and sharing is Sharing.EXCLUSIVE):
        return False
    need = demand.memory_enforcement
    return need is _ANY_MEMORY or gpu.memory_enforcement.rank >= need.rank


def mode_neutral(demand: Demand) -> bool:
    """Whether every GPU that is not CLOSED suits `demand` as far as `mode_admits` goes (its mode then
    matters to the demand no more than health does)."""
    return not demand.timeslice and demand.memory_enforcement is _ANY_MEMORY


def mode_misfit(gpus: Sequence[Gpu], demand: Demand) -> str:
    """Why `gpus` (whole GPUs of one node) do not suit `demand`'s isolation, naming what the pod asks
    and what the GPUs give."""
    closed = [g.index for g in gpus if g.sharing is Sharing.CLOSED]
    open_ = [g for g in gpus if g.sharing is not Sharing.CLOSED]
    parts: list[str] = []
    if demand.timeslice and any(g.sharing is Sharing.EXCLUSIVE for g in open_):
        exclusive = [g.index for g in open_ if g.sharing is Sharing.EXCLUSIVE]
        parts.append(
            f"pod asks {names.ISOLATION}=none (time-slicing), but GPU {_indexes(exclusive)} "
            f"{'is' if len(exclusive) == 1 else 'are'} in EXCLUSIVE_PROCESS for MPS (sharing "
            f"'{Sharing.EXCLUSIVE.value}'), which refuses a process outside MPS"
        )
        open_ = [g for g in open_ if g.sharing is not Sharing.EXCLUSIVE]
    need = demand.memory_enforcement
    below = [g for g in open_ if need is not _ANY_MEMORY and g.memory_enforcement.rank < need.rank]
    if below:
        best = max((g.memory_enforcement for g in below), key=lambda m: m.rank)
        gives = (
            f"this node's GPUs give at most '{best.value}'"
            if len(below) == len(open_)
            else f"GPU {_indexes([g.index for g in below])} give{'s' if len(below) == 1 else ''} at most "
            f"'{best.value}'"
        )
        parts.append(
            f"pod requires GPU memory enforcement '{need.value}' ({names.MEMORY_ENFORCEMENT}), but {gives}"
        )
    if closed:
        parts.append(
            f"GPU {_indexes(closed)} in EXCLUSIVE_PROCESS with no MPS daemon serving "
            f"{'it' if len(closed) == 1 else 'them'} (sharing '{Sharing.CLOSED.value}'): no new share "
            "until the daemon is back"
        )
    return "; ".join(parts)


def _indexes(indexes: Sequence[int]) -> str:
    return ", ".join(map(str, indexes))


def array_modelled(gpu: Gpu) -> bool:
    """Whether `gpu_fits` on this GPU reads only health, model, milli and memory room (what an array form
    computes from numbers); a node with any other GPU is left to the policy's own filter. A CLOSED GPU
    refuses every share (`mode_admits`), which the arrays do not model; demands with an isolation need
    are left to the policy whole (`mode_neutral`)."""
    return not gpu.mig_profile and gpu.sharing is not _CLOSED


def host_shortfall(
    schedulable: bool, cpu: int | None, mem: int | None, mps: bool, demand: Demand
) -> Shortfall | None:
    """The node-wide rule, in the order a node must pass it: schedulable, host CPU and memory (where the
    node's allocatable is known), MPS where a GPU pod asks for it. None when the node passes."""
    if not schedulable:
        return Shortfall.UNSCHEDULABLE
    if cpu is not None and demand.cpu_milli > cpu:
        return Shortfall.CPU
    if mem is not None and demand.host_memory_mib > mem:
        return Shortfall.HOST_MEMORY
    if demand.count and demand.needs_mps and not mps:
        return Shortfall.NO_MPS
    return None


def host_fits(node: Node, demand: Demand) -> bool:
    """The node-wide checks of `node_fits`: `host_shortfall` finds none."""
    return (
        host_shortfall(node.schedulable, node.cpu_milli_free, node.memory_mib_free, node.mps, demand) is None
    )


def live_load(gpu: Gpu) -> tuple[int, int]:
    """Sort key among GPUs a policy scores equal: least utilised, then most NVML-free memory.

    Unknown readings (simulator, no agent data) sort as idle and empty, so ties fall to the index.
    """
    return (gpu.utilization_percent or 0, -(gpu.live_free_mib if gpu.live_free_mib is not None else 0))


def fitting_gpus(node: Node, demand: Demand, margin_mib: int = FOREIGN_MARGIN_MIB) -> list[Gpu]:
    """The node's GPUs that can each take one device of `demand`: least loaded first, then by index.

    Policies keep the first of the GPUs they score equal, so this order is their tie-break.
    """
    return sorted((g for g in node.gpus if gpu_fits(g, demand, margin_mib)), key=tie_order)


def tie_order(gpu: Gpu) -> tuple[int, int, int]:
    return (*live_load(gpu), gpu.index)


def best_fit(gpus: Sequence[Gpu], count: int) -> tuple[int, ...]:
    """`count` GPU indexes with the least free compute (least loaded, then first index, on ties)."""
    return tuple(sorted(g.index for g in sorted(gpus, key=lambda g: (g.milli_free, *tie_order(g)))[:count]))


def node_fits(node: Node, demand: Demand, margin_mib: int = FOREIGN_MARGIN_MIB) -> bool:
    """Whether `node` can take `demand`: `node_misfit(...) is None` without building a reason."""
    if (
        host_shortfall(node.schedulable, node.cpu_milli_free, node.memory_mib_free, node.mps, demand)
        is not None
    ):
        return False
    wanted = demand.count
    if not wanted:
        return True
    for g in node.gpus:  # counted, not sorted: which GPUs is the policy's choice, later
        if gpu_fits(g, demand, margin_mib):
            wanted -= 1
            if not wanted:
                return True
    return False


@dataclass(frozen=True, slots=True)
class Headroom:
    """What the fit check and the simple scores read of one node state, reduced for share demands.

    Computed once per node state and shared by every demand shape: `headroom_fits` then answers a share
    demand (see `is_share`) in O(1), exactly as `node_fits` does. Equal values judge every demand alike.
    """

    schedulable: bool
    mps: bool
    cpu_milli_free: int | None
    memory_mib_free: int | None
    # Per healthy whole GPU, largest first: the largest milli share it can still take (milli and memory
    # room both), -1 when none. A GPU takes a share of m milli exactly when m <= its cap.
    caps: tuple[int, ...]
    milli_free_total: int  # Node.milli_free_total
    healthy: int  # healthy whole GPUs
    whole: bool  # the node has a whole (non-MIG) GPU, healthy or not: demand_milli's condition


def headroom(node: Node, margin_mib: int = FOREIGN_MARGIN_MIB) -> Headroom:
    # One pass over the GPUs, the cap inlined: this runs on every change of every node in a replay.
    caps: list[int] = []
    milli_free_total = 0
    whole = False
    for g in node.gpus:
        if g.mig_profile:
            continue
        whole = True
        if not g.healthy:
            continue
        free = MILLI_PER_GPU - g.milli_used
        milli_free_total += free
        caps.append(_share_cap(g, free, margin_mib))
    caps.sort(reverse=True)
    return Headroom(
        schedulable=node.schedulable,
        mps=node.mps,
        cpu_milli_free=node.cpu_milli_free,
        memory_mib_free=node.memory_mib_free,
        caps=tuple(caps),
        milli_free_total=milli_free_total,
        healthy=len(caps),
        whole=whole,
    )


def _share_cap(gpu: Gpu, free: int, margin_mib: int) -> int:
    """The largest m with m <= `free` (1000 - milli_used) and m * memory // 1000 <= memory room (-1: no
    m >= 0)."""
    foreign = gpu.foreign_mib  # memory_room, inlined
    room = gpu.memory_mib - gpu.memory_used_mib - foreign - (margin_mib if foreign > 0 else 0)
    if room < 0 or gpu.sharing is _CLOSED:  # a CLOSED GPU takes no share (`mode_admits`)
        return -1
    if not gpu.memory_mib:
        return max(free, -1)
    # m * M // 1000 <= room  <=>  m * M < (room + 1) * 1000; the memory term is monotone in m.
    return max(min(free, ((room + 1) * MILLI_PER_GPU - 1) // gpu.memory_mib), -1)


def is_share(demand: Demand) -> bool:
    """A demand `headroom_fits` answers: a share of whole GPUs of any model (or no GPU at all), with no
    isolation need beyond the node's MPS (`mode_neutral`)."""
    return (
        not (demand.mig or demand.mig_profile or demand.models)
        and (demand.milli is not None or not demand.count)
        and mode_neutral(demand)
    )


def headroom_fits(room: Headroom, demand: Demand) -> bool:
    """`node_fits(node, demand)` for a share demand (`is_share`), from `headroom(node)`."""
    # `host_shortfall`, inlined: this is the replay's check per node state per shape (tests/unit/
    # test_placement_fit_rules.py holds it to the rule on generated clusters).
    if not room.schedulable:
        return False
    wanted, cpu, mem = demand.count, room.cpu_milli_free, room.memory_mib_free
    if (cpu is not None and demand.cpu_milli > cpu) or (mem is not None and demand.host_memory_mib > mem):
        return False
    if wanted and demand.needs_mps and not room.mps:
        return False
    caps = room.caps
    return not wanted or (len(caps) >= wanted and caps[wanted - 1] >= (demand.milli or 0))


def share_taken(room: Headroom, demand: Demand) -> int:
    """`demand_milli(node, demand) * demand.count` for a share demand, from `headroom(node)`."""
    return (demand.milli or 0) * demand.count if room.whole else 0


def within(room: Headroom, before: Headroom) -> bool:
    """`room` offers no more than `before` does: every demand that fits `room` also fit `before`.

    Same GPUs, health, schedulability and MPS, and no more host CPU, host memory or share on any GPU
    (the caps are compared largest to largest): what a node's headroom does when it only takes pods.
    """
    return (
        room.schedulable == before.schedulable
        and room.mps == before.mps
        and room.healthy == before.healthy
        and room.whole == before.whole
        and _at_most(room.cpu_milli_free, before.cpu_milli_free)
        and _at_most(room.memory_mib_free, before.memory_mib_free)
        and room.milli_free_total <= before.milli_free_total
        and all(c <= b for c, b in zip(room.caps, before.caps, strict=True))
    )


def _at_most(value: int | None, before: int | None) -> bool:
    return value == before if value is None or before is None else value <= before


@runtime_checkable
class HeadroomScore(Protocol):
    """A policy whose score of a share demand depends on the node only through `headroom(node)`."""

    # True when the score never rises as the headroom shrinks (`within(room, before)` implies
    # score(room) <= score(before)): a replay may then keep a node's old score as a bound on its new one.
    score_falls_with_room: bool

    def score_headroom(self, room: Headroom, demand: Demand) -> float:
        """`score(node, demand)` for a share demand (`is_share`), from `headroom(node, margin_mib)`."""
        ...


def node_misfit(node: Node, demand: Demand, margin_mib: int = FOREIGN_MARGIN_MIB) -> PlacementReason | None:
    """None when `node` can take `demand`; otherwise the first rule it breaks."""
    if node_fits(node, demand, margin_mib):
        return None

    host = host_shortfall(node.schedulable, node.cpu_milli_free, node.memory_mib_free, node.mps, demand)
    if host is None:
        return _gpu_shortfall(node, demand, margin_mib)
    return _host_reason(node, demand, host)


def _host_reason(node: Node, demand: Demand, shortfall: Shortfall) -> PlacementReason:
    """The refusal for a `host_shortfall`: what the demand needs and the node offers, or why not."""
    needed = free = 0
    detail = ""
    if shortfall is Shortfall.UNSCHEDULABLE:
        detail = node.unschedulable_reason
    elif shortfall is Shortfall.CPU:
        needed, free = demand.cpu_milli, node.cpu_milli_free or 0
    elif shortfall is Shortfall.HOST_MEMORY:
        needed, free = demand.host_memory_mib, node.memory_mib_free or 0
    else:
        return PlacementReason(
            node.name, None, Shortfall.NO_MPS, detail=node.mps_reason, asked=demand.mps_asked_by
        )
    return PlacementReason(node.name, None, shortfall, needed, free, detail=detail)


# Checks in the order a GPU must pass them: (passes, what the demand needs, what a GPU offers).
_Check = Callable[[Gpu, Demand, int], tuple[bool, int, int]]


def _milli_check(g: Gpu, d: Demand, _: int) -> tuple[bool, int, int]:
    need = d.on(g.memory_mib)[0]
    return need <= g.milli_free, need, g.milli_free


def _memory_check(g: Gpu, d: Demand, margin: int) -> tuple[bool, int, int]:
    need = d.on(g.memory_mib)[1]
    room = memory_room(g, margin)
    return need <= room, need, room


def _gpu_shortfall(node: Node, demand: Demand, margin_mib: int) -> PlacementReason:
    if not node.gpus:
        return PlacementReason(node.name, None, Shortfall.NO_GPUS)
    gpus = [g for g in node.gpus if g.healthy]
    if not gpus:
        return PlacementReason(node.name, None, Shortfall.NO_HEALTHY_GPU)
    gpus = [g for g in gpus if demand.accepts(g.model)]
    if not gpus:
        models = tuple(sorted(demand.models))
        return PlacementReason(node.name, None, Shortfall.MODEL, detail=node.model, models=models)
    if demand.mig:
        return mig_shortfall(node.name, gpus, demand, margin_mib)
    gpus = [g for g in gpus if not g.is_mig]
    if not gpus:
        return PlacementReason(node.name, None, Shortfall.ALL_MIG)
    admitted = [g for g in gpus if mode_admits(g, demand)]
    if len(admitted) < min(len(gpus), demand.count):  # too few left because of their mode
        return PlacementReason(
            node.name,
            None,
            Shortfall.ISOLATION,
            count=demand.count,
            passing=len(admitted),
            detail=mode_misfit(gpus, demand),
        )
    checks: tuple[tuple[_Check, Shortfall], ...] = (
        (_milli_check, Shortfall.GPU_SHARE),
        (_memory_check, Shortfall.GPU_MEMORY),
    )
    # GPUs with room that only their mode keeps from the demand (e.g. `closed` while the MPS daemon is
    # down): if they are what is missing, their mode is the reason, not the room of the others.
    held_by_mode = [
        g for g in gpus if g not in admitted and all(c(g, demand, margin_mib)[0] for c, _ in checks)
    ]
    gpus = admitted
    for check, shortfall in checks:
        results = [check(g, demand, margin_mib) for g in gpus]
        passing = [g for g, r in zip(gpus, results, strict=True) if r[0]]
        if len(passing) < demand.count:
            if len(passing) + len(held_by_mode) >= demand.count:
                return PlacementReason(
                    node.name, None, Shortfall.ISOLATION, count=demand.count, passing=len(admitted),
                    detail=mode_misfit(held_by_mode, demand),
                )  # fmt: skip
            return PlacementReason(
                node.name,
                None,
                shortfall,
                needed=max(r[1] for r in results),
                free=max(r[2] for r in results),
                count=demand.count,
                passing=len(passing),
                foreign=_foreign(gpus, margin_mib) if shortfall is Shortfall.GPU_MEMORY else None,
            )
        gpus = passing
    raise AssertionError("unreachable while the checks mirror gpu_fits")


def _foreign(gpus: Sequence[Gpu], margin_mib: int) -> ForeignUse | None:
    """Where foreign processes take memory, say so: it is the part of "free" users cannot see in our pods."""
    foreign = [g for g in gpus if g.foreign_mib > 0]
    if not foreign:
        return None
    g = max(foreign, key=lambda g: g.foreign_mib)
    return ForeignUse(g.index, g.memory_mib, g.memory_used_mib, g.foreign_mib, margin_mib)


def mig_shortfall(node: str, gpus: Sequence[Gpu], demand: Demand, margin_mib: int) -> PlacementReason:
    """Why none (or too few) of a node's MIG devices can take a MIG demand, naming the largest free one."""
    free = [g for g in gpus if g.is_mig and g.milli_used == 0 and g.memory_mib <= memory_room(g, margin_mib)]
    largest = max(free, key=lambda g: (g.memory_mib, -g.index), default=None)
    return PlacementReason(
        node,
        None,
        Shortfall.MIG_DEVICE,
        needed=demand.memory_mib or 0,
        free=largest.memory_mib if largest else 0,
        count=demand.count,
        passing=sum(1 for g in free if demand.targets(g)),
        detail=largest.mig_profile if largest else "",
        profile=demand.mig_profile,
        mig_devices=sum(1 for g in gpus if g.is_mig),
    )


class FitFilter:
    """The filter every built-in policy shares: node state, host resources, then per-GPU fit."""

    margin_mib: int = FOREIGN_MARGIN_MIB

    def filter(self, node: Node, demand: Demand) -> PlacementReason | None:
        return node_misfit(node, demand, self.margin_mib)

    def fits(self, node: Node, demand: Demand) -> bool:
        """`filter(node, demand) is None`, for callers that need no reason (the simulator)."""
        return node_fits(node, demand, self.margin_mib)


def uses_fit_filter(policy: Policy) -> TypeGuard[FitFilter]:
    """Whether `policy.filter` is FitFilter's own (not overridden), so `node_fits` answers for it."""
    own: object = type(policy).filter
    return isinstance(policy, FitFilter) and own is FitFilter.filter


def fits_check(policy: Policy) -> Callable[[Node, Demand], bool]:
    """Yes/no for `policy.filter`: the shared fit check where the policy's filter is FitFilter's own."""
    if uses_fit_filter(policy):
        return policy.fits
    return lambda node, demand: policy.filter(node, demand) is None


def demand_milli(node: Node, demand: Demand) -> int:
    """Milli per device the demand takes on this node's (first whole) GPU model."""
    whole = next((g for g in node.gpus if not g.is_mig), None)
    return demand.on(whole.memory_mib)[0] if whole is not None and demand.count else 0
