"""The cluster as placement sees it: what a pod asks for, GPUs, nodes and allocations (pure values)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from app.core import names
from app.core.errors import RequestError
from app.core.isolation import MemoryEnforcement, Sharing

MILLI_PER_GPU = 1000
# What a CUDA context takes of a share's memory limit: it counts against the MPS pinned limit (measured on an
# H100, driver 580: 514 MiB for a driver-API process, 283 MiB for PyTorch; docs/node-side.md).
CUDA_CONTEXT_MIB = 514
# A MIG device is a placement target of its own; its index on the node is MIG_INDEX_BASE * (parent GPU
# index + 1) + its NVML slot (GPU 0 slot 2 = 102, GPU 1 slot 0 = 200), so it never collides with a GPU's.
MIG_INDEX_BASE = 100


def mig_index(parent: int, slot: int) -> int:
    """The node-wide index of MIG device `slot` of GPU `parent` (see MIG_INDEX_BASE)."""
    return MIG_INDEX_BASE * (parent + 1) + slot


@dataclass(frozen=True, slots=True)
class Demand:
    """What one pod asks of a node, in placement units.

    Exactly one of `milli` (a fraction request) and `memory_mib` (a memory request) is set when
    `count > 0`. A fraction also reserves the same share of the GPU's memory (rounded down); a memory
    request also reserves the same share of compute (rounded up), so both dimensions are accounted.
    """

    count: int  # GPUs wanted; 0 only for CPU-only pods in the simulator
    milli: int | None = None  # share of each GPU, 1..1000
    memory_mib: int | None = None  # memory on each GPU
    models: frozenset[str] = frozenset()  # acceptable GPU models; empty = any
    # Host resources the pod requests (the simulator's trace, the pod spec in a cluster): placement
    # scores with them exactly as the simulator does; kube-scheduler also checks them.
    cpu_milli: int = 0
    host_memory_mib: int = 0
    needs_mps: bool = False  # the pod asked for `isolation: mps` explicitly: only nodes running MPS fit
    # What the pod wrote that asks for MPS, as `key=value` (`gpupack.io/isolation=mps`, or KAI's
    # sm-sharing mode), so a refusal names the user's own words; "" where no pod wrote it (simulations).
    mps_asked_by: str = ""
    # MIG: the demand takes whole MIG devices (never a whole GPU or a share of one): of this profile when
    # `mig_profile` is set, else the smallest free one with `memory_mib` (isolation: mig).
    mig: bool = False
    mig_profile: str = ""
    timeslice: bool = False  # the pod asked for `isolation: none` explicitly: not on EXCLUSIVE_PROCESS GPUs
    memory_enforcement: MemoryEnforcement = MemoryEnforcement.NONE  # the least a GPU must enforce
    # Burstable: the most memory the pod may use on each GPU, in MiB (gpu-memory-limit) or as a share of the
    # GPU's memory (KAI's gpu-fraction.limit). Placement never reads it (it counts the request); the
    # allocation records it as the pod's hard cap.
    memory_limit_mib: int | None = None
    memory_limit_share: Fraction | None = None

    def on(self, gpu_memory_mib: int) -> tuple[int, int]:
        """(milli, MiB) this demand takes on one GPU that has `gpu_memory_mib` in total."""
        if self.mig:  # a MIG device is taken whole, all its memory included
            return MILLI_PER_GPU, gpu_memory_mib
        if self.milli is not None:
            # Floor, so shares that sum to at most 1000 milli also fit the GPU's memory together.
            return self.milli, self.milli * gpu_memory_mib // MILLI_PER_GPU
        if self.memory_mib is not None:
            # More memory than the GPU has yields milli > 1000, which no GPU fits. Integer ceiling:
            # float division can push a share that just fits past it.
            if not gpu_memory_mib:
                return MILLI_PER_GPU + 1, self.memory_mib
            return -(-self.memory_mib * MILLI_PER_GPU // gpu_memory_mib), self.memory_mib
        return 0, 0

    def hard_limit_on(self, gpu_memories: Iterable[int]) -> int | None:
        """The burstable cap on GPUs of these sizes (None: not burstable): the limit, but never above a GPU's
        memory nor below the request on it (a fraction's request grows with the GPU); the least of them."""
        if self.memory_limit_mib is None and self.memory_limit_share is None:
            return None
        return min(max(self.on(mem)[1], min(self._limit_on(mem), mem)) for mem in gpu_memories)

    def _limit_on(self, gpu_memory_mib: int) -> int:
        """The limit in MiB on a GPU of that size: as written, or its share of the GPU (floored)."""
        if self.memory_limit_mib is not None:
            return self.memory_limit_mib
        assert self.memory_limit_share is not None
        return math.floor(self.memory_limit_share * gpu_memory_mib)

    def accepts(self, model: str) -> bool:
        return not self.models or model in self.models

    def targets(self, gpu: Gpu) -> bool:
        """Whether `gpu` is the kind of target this demand can use at all: MIG devices for MIG demands
        (of the profile, or with the memory), whole GPUs for every other one."""
        if self.mig != gpu.is_mig:
            return False
        if self.mig_profile:
            return gpu.mig_profile == self.mig_profile
        return not self.mig or self.memory_mib is None or gpu.memory_mib >= self.memory_mib

    @property
    def is_whole(self) -> bool:
        return self.milli == MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU: its inventory, what gpupack has reserved on it, and what NVML last saw."""

    index: int
    model: str
    memory_mib: int
    uuid: str = ""
    milli_used: int = 0  # reserved by gpupack allocations
    memory_used_mib: int = 0  # reserved by gpupack allocations
    # Memory NVML sees used by processes that belong to no gpupack pod (other device plugins, host
    # processes). gpupack pods' own usage is covered by their reservations, so only this is added.
    foreign_mib: int = 0
    # Live readings, used only to break ties between GPUs the policy scores equal (None: unknown).
    live_free_mib: int | None = None
    utilization_percent: int | None = None
    healthy: bool = True
    mig_profile: str = ""  # set on a MIG device (e.g. "1g.10gb"): a target taken whole, never shared
    parent: int | None = None  # a MIG device's GPU index
    sharing: Sharing = Sharing.UNKNOWN  # what kind of pod may share it (app.core.isolation)
    memory_enforcement: MemoryEnforcement = MemoryEnforcement.NONE  # what holds a pod to its memory share

    @property
    def is_mig(self) -> bool:
        return bool(self.mig_profile)

    @property
    def device(self) -> str:
        """How tools name it: the GPU's index, or a MIG device's parent GPU and NVML slot ("0/2")."""
        if self.parent is None:
            return str(self.index)
        return f"{self.parent}/{self.index - mig_index(self.parent, 0)}"

    @property
    def milli_free(self) -> int:
        return MILLI_PER_GPU - self.milli_used

    @property
    def memory_free_mib(self) -> int:
        """Memory a new reservation may take: total minus gpupack reservations and foreign usage."""
        return self.memory_mib - self.memory_used_mib - self.foreign_mib

    def reserve(self, milli: int, memory_mib: int) -> Gpu:
        # Every field by hand, not dataclasses.replace: this runs once per GPU per placement, and replace
        # costs twice as much (tests/unit/test_model.py checks that no field is dropped).
        return Gpu(
            self.index,
            self.model,
            self.memory_mib,
            self.uuid,
            self.milli_used + milli,
            self.memory_used_mib + memory_mib,
            self.foreign_mib,
            self.live_free_mib,
            self.utilization_percent,
            self.healthy,
            self.mig_profile,
            self.parent,
            self.sharing,
            self.memory_enforcement,
        )


@dataclass(frozen=True, slots=True)
class Node:
    """A node's GPUs plus the host resources placement may check."""

    name: str
    gpus: tuple[Gpu, ...]
    cpu_milli_free: int | None = None  # None: not tracked here (kube-scheduler accounts it)
    memory_mib_free: int | None = None
    schedulable: bool = True  # False when the agent's heartbeat is stale or the node is cordoned for us
    unschedulable_reason: str = ""
    mps: bool = True  # an MPS control daemon serves the node's GPUs (False: `isolation: mps` pods do not fit)
    mps_reason: str = ""  # why not, for the refusal message

    @property
    def model(self) -> str:
        return self.gpus[0].model if self.gpus else ""

    @property
    def milli_free_total(self) -> int:
        """Unreserved compute over the node's healthy whole GPUs (MIG devices are not shared)."""
        return sum([MILLI_PER_GPU - g.milli_used for g in self.gpus if g.healthy and not g.mig_profile])

    @property
    def whole_lefts(self) -> tuple[int, ...]:
        """Free milli of each healthy whole GPU, ascending: what fragmentation is measured on."""
        # A list comprehension over the fields, not properties in a generator: this is on every score.
        return tuple(
            sorted([MILLI_PER_GPU - g.milli_used for g in self.gpus if g.healthy and not g.mig_profile])
        )

    def gpu(self, index: int) -> Gpu:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(f"{self.name} has no GPU with index {index}")

    def reserve(self, allocs: Iterable[Allocation], sign: int = 1) -> Node:
        """This node with each allocation's share reserved on its GPUs (`sign=-1` gives it back).

        No fit check: the allocations already happened. One new Node however many allocations there are.
        """
        milli: dict[int, int] = {}
        memory: dict[int, int] = {}
        for alloc in allocs:
            for i in alloc.gpu_indexes:
                milli[i] = milli.get(i, 0) + sign * alloc.milli
                memory[i] = memory.get(i, 0) + sign * alloc.memory_mib
        if not milli:
            return self
        gpus = tuple(g.reserve(milli[g.index], memory[g.index]) if g.index in milli else g for g in self.gpus)
        return self._with(gpus, self.cpu_milli_free, self.memory_mib_free)

    def charge_host(self, cpu_milli: int, memory_mib: int) -> Node:
        """This node with host CPU and memory taken (negative amounts give them back); untracked stays so."""
        if not cpu_milli and not memory_mib:
            return self
        return self._with(
            self.gpus,
            None if self.cpu_milli_free is None else self.cpu_milli_free - cpu_milli,
            None if self.memory_mib_free is None else self.memory_mib_free - memory_mib,
        )

    def _with(self, gpus: tuple[Gpu, ...], cpu_milli_free: int | None, memory_mib_free: int | None) -> Node:
        """This node with other GPUs and host room; every field by hand, as Gpu.reserve (placement path)."""
        return Node(
            self.name,
            gpus,
            cpu_milli_free,
            memory_mib_free,
            self.schedulable,
            self.unschedulable_reason,
            self.mps,
            self.mps_reason,
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    """Where one pod's GPU share went. Stored as pod annotations; everything else is derived from it."""

    node: str
    gpu_indexes: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    milli: int  # per device
    memory_mib: int  # per device: the reservation (a burstable pod's request)
    hard_limit_mib: int | None = None  # per device, a burstable pod's cap above `memory_mib`; None: the same

    @property
    def on_mig(self) -> bool:
        """Whether it holds MIG devices (their node-wide indexes start at MIG_INDEX_BASE)."""
        return any(i >= MIG_INDEX_BASE for i in self.gpu_indexes)

    @property
    def thread_percentage(self) -> int:
        """MPS active-thread share, in percent, never below 1."""
        return max(1, math.ceil(self.milli / 10))

    def to_annotations(self) -> dict[str, str]:
        return {
            names.ALLOC_NODE: self.node,
            names.ALLOC_GPU_UUIDS: ",".join(self.gpu_uuids),
            names.ALLOC_GPU_INDEXES: ",".join(str(i) for i in self.gpu_indexes),
            names.ALLOC_GPU_MILLI: str(self.milli),
            names.ALLOC_MEMORY_LIMIT_MIB: str(self.memory_mib),
            names.ALLOC_THREAD_PERCENTAGE: str(self.thread_percentage),
            # The legacy MPS pinned limit is the hard cap: what the pod may use, not what it reserved.
            names.ALLOC_MPS_MEMORY_LIMIT: ",".join(
                f"{i}={self.cap_mib}M" for i in range(len(self.gpu_indexes))
            ),
        } | (
            {}
            if self.hard_limit_mib is None
            else {names.ALLOC_MEMORY_HARD_LIMIT_MIB: str(self.hard_limit_mib)}
        )

    @property
    def cap_mib(self) -> int:
        """The most memory the pod may use on each GPU of the allocation."""
        return self.memory_mib if self.hard_limit_mib is None else self.hard_limit_mib

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> Allocation | None:
        """The allocation recorded on a pod, or None if it has none. Raises ValueError on a corrupt one."""
        node = annotations.get(names.ALLOC_NODE)
        if not node:
            return None
        errors = list(_allocation_errors(annotations))
        if errors:
            raise ValueError("; ".join(str(e) for e in errors))
        indexes = tuple(int(i) for i in annotations[names.ALLOC_GPU_INDEXES].split(","))
        uuids = tuple(u for u in annotations.get(names.ALLOC_GPU_UUIDS, "").split(",") if u)
        return cls(
            node=node,
            gpu_indexes=indexes,
            gpu_uuids=uuids,
            milli=int(annotations[names.ALLOC_GPU_MILLI]),
            memory_mib=int(annotations[names.ALLOC_MEMORY_LIMIT_MIB]),
            hard_limit_mib=int(hard)
            if (hard := annotations.get(names.ALLOC_MEMORY_HARD_LIMIT_MIB))
            else None,
        )


def _allocation_errors(annotations: Mapping[str, str]) -> Iterable[RequestError]:
    raw_idx = annotations.get(names.ALLOC_GPU_INDEXES, "")
    parts = raw_idx.split(",")
    if not raw_idx or not all(p.isascii() and p.isdigit() for p in parts):
        yield RequestError(names.ALLOC_GPU_INDEXES, raw_idx, "must be a comma list of GPU indexes")
    if len(set(parts)) != len(parts):
        yield RequestError(names.ALLOC_GPU_INDEXES, raw_idx, "must not repeat a GPU index")
    uuids = [u for u in annotations.get(names.ALLOC_GPU_UUIDS, "").split(",") if u]
    if uuids and len(uuids) != len(parts):
        yield RequestError(
            names.ALLOC_GPU_UUIDS, annotations[names.ALLOC_GPU_UUIDS], "must list one UUID per index"
        )
    for key, lo, hi in (
        (names.ALLOC_GPU_MILLI, 1, MILLI_PER_GPU),
        (names.ALLOC_MEMORY_LIMIT_MIB, 0, 1 << 40),
    ):
        raw = annotations.get(key, "")
        if not (raw.isascii() and raw.isdigit() and lo <= int(raw) <= hi):
            yield RequestError(key, raw, f"must be an integer in [{lo}, {hi}]")
    hard = annotations.get(names.ALLOC_MEMORY_HARD_LIMIT_MIB)
    reserved = annotations.get(names.ALLOC_MEMORY_LIMIT_MIB, "")
    if hard is not None and not (
        hard.isascii() and hard.isdigit() and reserved.isdigit() and int(reserved) <= int(hard) <= 1 << 40
    ):
        rule = f"must be an integer in [{names.ALLOC_MEMORY_LIMIT_MIB}, {1 << 40}]"
        yield RequestError(names.ALLOC_MEMORY_HARD_LIMIT_MIB, hard, rule)


@dataclass(slots=True)
class ClusterState:
    """Nodes with their reservations applied. Rebuilt from GPUNode objects plus pod annotations."""

    nodes: dict[str, Node] = field(default_factory=dict)

    @property
    def packing_efficiency(self) -> float:
        """Allocated share on the (whole) GPUs in use over those GPUs (0 when none is in use).

        MIG devices are left out: each is taken whole, so it is either full or free.
        """
        used = [
            g.milli_used
            for node in self.nodes.values()
            for g in node.gpus
            if g.milli_used > 0 and not g.is_mig
        ]
        return sum(used) / (len(used) * MILLI_PER_GPU) if used else 0.0

    def apply(self, alloc: Allocation) -> None:
        """Reserve an allocation's share on its GPUs (no fit check: the allocation already happened)."""
        self._change(alloc, +1)

    def release(self, alloc: Allocation) -> None:
        self._change(alloc, -1)

    def _change(self, alloc: Allocation, sign: int) -> None:
        node = self.nodes.get(alloc.node)
        if node is not None:
            self.nodes[alloc.node] = node.reserve((alloc,), sign)
