"""Burstable shares in the FGD replay: what requests below limits buy in pods, and the eviction exposure.

A trace pod's share is what it may use at its peak: its **limit**. At a request/limit ratio r, each shared
pod (less than a whole GPU per device) asks placement for r x its share, rounded up to a milli, and keeps
its limit as the hard cap (`gpupack.io/gpu-memory-limit`); whole-GPU pods are unchanged (nothing to
borrow). Placement counts requests only, as in a cluster. Every ratio replays the same arrivals: the trace
shuffled and drawn with replacement until the offered *limits* reach `inflate` x capacity (the FGD
arrival sequence of `app.tools.sim.engine`), pods that fit nowhere dropped.

Exposure, read on the final state (where the cluster is full), with a share of a GPU counting that share of
its memory (the trace has no memory column; a fraction reserves the same share of memory in gpupack):

- **over-committed GPUs**: GPUs in use whose pods' limits sum above the GPU (1000 milli);
- **exposed pods**: burstable pods on such GPUs, the ones MPS may evict when neighbours claim their
  requests while they use more than theirs;
- **over-soft demand**: if every pod used its whole limit at once, the memory above the GPUs' sizes
  (summed over GPUs, in % of the memory of the GPUs in use): what MPS would have to reclaim;
- **host CPU**: requested by the pods placed, in % of the nodes' CPU: smaller GPU requests let more pods in
  until the nodes' CPU, not their GPUs, is what is full;
- **evictions if all burst**: the fewest pods to evict, GPU by GPU (largest limits first), so that the
  limits of the pods left fit, in % of the shared pods placed. An upper bound on one moment; pods rarely
  peak together.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.core.model import MILLI_PER_GPU, Demand, Node
from app.core.placement import Policy, TargetWorkload
from app.tools.sim.engine import arrival_sequence
from app.tools.sim.loader import TracePod
from bench.workloads.churn import Replay


@dataclass(frozen=True, slots=True)
class BurstResult:
    ratio: float
    seed: int
    arrived: int  # pods offered
    placed: int  # pods placed (any kind)
    placed_gpu: int  # pods placed that use a GPU
    placed_shared: int  # of those, pods sharing a GPU (less than a whole one per device): the burstable kind
    gpus: int
    gpus_in_use: int
    requested_pct: float  # requests placed, in % of all GPU capacity
    limits_pct: float  # limits of the pods placed, in % of all GPU capacity
    host_cpu_pct: float  # host CPU requested by the pods placed, in % of the nodes' CPU (the other bound)
    overcommitted_gpus: int
    exposed_pods: int
    over_soft_pct: float
    evictions_if_all_burst: int
    seconds: float

    @property
    def overcommitted_pct(self) -> float:
        return _pct(self.overcommitted_gpus, self.gpus_in_use)

    @property
    def exposed_pct(self) -> float:
        return _pct(self.exposed_pods, self.placed_shared)

    @property
    def evictions_pct(self) -> float:
        return _pct(self.evictions_if_all_burst, self.placed_shared)


def _pct(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def burstable(demand: Demand, ratio: float) -> Demand:
    """The request of a pod whose peak share is `demand`, at `ratio`; whole GPUs and CPU-only pods stay."""
    if demand.milli is None or demand.milli >= MILLI_PER_GPU or ratio >= 1:
        return demand
    return replace(demand, milli=max(1, math.ceil(demand.milli * ratio - 1e-9)))


def burst(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policy: Policy,
    workload: TargetWorkload,
    *,
    ratio: float,
    seed: int,
    inflate: float = 2.6,
) -> BurstResult:
    """One (ratio, seed) replay (see the module docstring); every ratio of a seed sees the same arrivals."""
    if not 0 < ratio <= 1:
        raise ValueError(f"ratio={ratio!r}: must be in (0, 1]")
    started = time.perf_counter()
    capacity = MILLI_PER_GPU * sum(len(n.gpus) for n in nodes)
    seq, order = arrival_sequence(pods, len(nodes), capacity, seed, inflate)
    sim = Replay(nodes, policy, workload, order)
    limits: dict[str, int] = {}  # running pod -> its limit per device (milli)
    for pod in seq:
        if sim.arrive(burstable(pod.demand, ratio)):
            uid = next(reversed(sim.running))  # the pod just placed
            limits[uid] = pod.demand.milli or 0
    # (node, GPU) -> (pod, request, limit) of each pod on it
    per_gpu: dict[tuple[int, int], list[tuple[str, int, int]]] = defaultdict(list)
    placed_gpu = placed_shared = requested = limited = 0
    for uid, p in sim.running.items():
        request, limit = p.demand.milli or 0, limits[uid]
        placed_gpu += bool(p.gpus)
        placed_shared += 0 < limit < MILLI_PER_GPU
        for g in p.gpus:
            per_gpu[(p.node, g)].append((uid, request, limit))
        requested += request * len(p.gpus)
        limited += limit * len(p.gpus)
    overcommitted = over = 0
    exposed: set[str] = set()
    evicted: set[str] = set()
    for shares in per_gpu.values():
        excess = sum(limit for _, _, limit in shares) - MILLI_PER_GPU
        if excess <= 0:
            continue
        overcommitted += 1
        over += excess
        exposed.update(uid for uid, request, limit in shares if limit > request)
        for uid, _, limit in sorted(shares, key=lambda s: -s[2]):  # the fewest evictions: largest first
            if excess <= 0:
                break
            excess -= limit
            evicted.add(uid)
    in_use = len(per_gpu)
    cpu = sum(n.cpu_milli_free or 0 for n in nodes)
    cpu_left = sum(n.cpu_milli_free or 0 for n in sim.cluster.nodes)
    return BurstResult(
        ratio=ratio,
        seed=seed,
        arrived=len(seq),
        placed=len(sim.running),
        placed_gpu=placed_gpu,
        placed_shared=placed_shared,
        gpus=capacity // MILLI_PER_GPU,
        gpus_in_use=in_use,
        requested_pct=100.0 * requested / capacity,
        limits_pct=100.0 * limited / capacity,
        host_cpu_pct=_pct(cpu - cpu_left, cpu),
        overcommitted_gpus=overcommitted,
        exposed_pods=len(exposed),
        over_soft_pct=_pct(over, in_use * MILLI_PER_GPU),
        evictions_if_all_burst=len(evicted),
        seconds=time.perf_counter() - started,
    )
