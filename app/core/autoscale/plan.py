"""How many GPUs, of which model, pending gpupack pods need beyond the nodes the cluster has (pure).

An autoscaler simulates kube-scheduler without its extenders, so it cannot see which GPU a share fits on,
and it skips pods whose resources no node template offers (every gpupack pod asks for gpupack.io/*). This
planner answers for it with the extender's own placement code: each pending pod is first placed, with
`place`, on the nodes there are (reserving as it goes, as the extender would bind them one by one); the pods
left over are placed on empty *virtual* nodes shaped like the autoscaler's node pools. The GPUs those virtual
nodes end up using are the request: five 0.3 shares packed three and two make two GPUs, not five.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from app.core import catalog
from app.core.errors import PlacementReason
from app.core.model import Demand, Gpu, Node
from app.core.placement import Placement, Policy, to_allocation
from app.core.placement.engine import Engine

VIRTUAL_PREFIX = "autoscale-virtual-"  # names of the nodes the planner imagines (never real ones)


@dataclass(frozen=True, slots=True)
class Pool:
    """A node shape the autoscaler can add: `gpus` GPUs of `model` each (a catalogue name)."""

    model: str
    gpus: int

    @classmethod
    def parse(cls, raw: str) -> Pool:
        """`MODEL:GPUS`, e.g. "A100-80GB:8"; ValueError names the value and the rule."""
        model, sep, count = raw.rpartition(":")
        if not sep or not model or not (count.isascii() and count.isdigit()) or not 1 <= int(count) <= 64:
            raise ValueError(
                f"{raw!r}: must be MODEL:GPUS with GPUS an integer from 1 to 64, e.g. A100-80GB:8"
            )
        try:
            spec = catalog.lookup(model)
        except KeyError as exc:
            raise ValueError(f"{raw!r}: {exc.args[0]}") from None
        return cls(spec.name, int(count))

    def empty_node(self, name: str) -> Node:
        memory = catalog.lookup(self.model).memory_mib
        gpus = tuple(Gpu(index=i, model=self.model, memory_mib=memory) for i in range(self.gpus))
        return Node(name=name, gpus=gpus)


@dataclass(frozen=True, slots=True)
class Coming:
    """Capacity on its way: a node the autoscaler is adding for a placeholder asked for earlier, of `pool`'s
    shape (`name`: the node the placeholder is bound to, or the placeholder itself while it waits)."""

    name: str
    pool: Pool


@dataclass(frozen=True, slots=True)
class PendingPod:
    key: str  # namespace/name
    demand: Demand


@dataclass(frozen=True, slots=True)
class Request:
    """Whole GPUs wanted on one new node of `pool`: one placeholder pod asks for them together, so GPUs a
    multi-GPU pod needs on one node are asked for on one node."""

    pool: Pool
    gpus: int
    pods: tuple[str, ...]  # the pending pods (namespace/name) packed onto them


@dataclass(frozen=True, slots=True)
class Unplaceable:
    key: str
    why: str  # no pool offers a GPU this pod fits on (model, memory or GPU count)


@dataclass(frozen=True, slots=True)
class ScalePlan:
    requests: tuple[Request, ...]  # new capacity wanted, one entry per imagined node
    fit_now: tuple[str, ...]  # pending pods the nodes there are already have room for
    unplaceable: tuple[Unplaceable, ...]
    awaited: tuple[str, ...] = ()  # the capacity on its way (Coming.name) that pending pods are planned on

    @property
    def gpus(self) -> int:
        return sum(r.gpus for r in self.requests)


def plan(
    nodes: Iterable[Node],
    pending: Sequence[PendingPod],
    pools: Sequence[Pool],
    policy: Policy,
    coming: Sequence[Coming] = (),
) -> ScalePlan:
    """The GPUs `pending` (in scheduling order) needs on top of `nodes` and of the nodes `coming`, packed by
    `policy`. A node on its way is filled before another one is imagined: asking again for the pods it will
    take would add a node per round while earlier ones still come up.

    Pods are placed in the order given, as kube-scheduler's queue hands them to the extender. A pod goes on
    the first pool whose model it accepts and whose nodes have enough GPUs for it; a pool's virtual nodes
    are filled by the policy before another one is imagined.
    """
    engine = Engine(policy)  # a burst of pods shares a few shapes: unchanged nodes answer from memory
    real = {n.name: n for n in nodes}
    virtual: dict[str, Node] = {c.name: c.pool.empty_node(c.name) for c in coming}
    pool_of: dict[str, Pool] = {c.name: c.pool for c in coming}
    pods_on: dict[str, list[str]] = {}
    fit_now: list[str] = []
    unplaceable: list[Unplaceable] = []
    for pod in pending:
        got = engine.place(real.values(), pod.demand)
        if isinstance(got, Placement):
            real[got.node.name] = _reserve(got, pod.demand)
            fit_now.append(pod.key)
            continue
        pool = _pool_for(pod.demand, pools)
        if pool is None:
            unplaceable.append(Unplaceable(pod.key, _no_pool(pod.demand, pools)))
            continue
        mine = [n for name, n in virtual.items() if pool_of[name] == pool]
        got = engine.place(mine, pod.demand)
        if not isinstance(got, Placement):
            name = f"{VIRTUAL_PREFIX}{len(virtual)}"
            fresh = pool.empty_node(name)
            got = engine.place((fresh,), pod.demand)
            if not isinstance(got, Placement):
                unplaceable.append(Unplaceable(pod.key, _refusal(got)))
                continue
            pool_of[name] = pool
        virtual[got.node.name] = _reserve(got, pod.demand)
        pods_on.setdefault(got.node.name, []).append(pod.key)
    on_its_way = {c.name for c in coming}
    requests = tuple(
        Request(pool_of[name], sum(1 for g in node.gpus if g.milli_used > 0), tuple(pods_on[name]))
        for name, node in virtual.items()
        if name not in on_its_way
    )
    awaited = tuple(name for name in virtual if name in on_its_way and name in pods_on)
    return ScalePlan(requests, tuple(fit_now), tuple(unplaceable), awaited)


def _reserve(got: Placement, demand: Demand) -> Node:
    node = got.node.reserve((to_allocation(got.node, demand, got.gpus),))
    return node.charge_host(demand.cpu_milli, demand.host_memory_mib)


def _pool_for(demand: Demand, pools: Sequence[Pool]) -> Pool | None:
    for pool in pools:
        if demand.accepts(pool.model) and demand.count <= pool.gpus and not demand.mig:
            return pool
    return None


def _no_pool(demand: Demand, pools: Sequence[Pool]) -> str:
    if demand.mig:
        return "MIG devices are not requested from the autoscaler (a pool's GPUs come without MIG layout)"
    offered = ", ".join(f"{p.model}:{p.gpus}" for p in pools) or "none"
    wanted = "|".join(sorted(demand.models)) or "any model"
    return f"no node pool offers {demand.count} GPU(s) of {wanted} (pools: {offered})"


def _refusal(reasons: tuple[PlacementReason, ...]) -> str:
    return "; ".join(str(r) for r in reasons) or "no GPU of an empty node fits it"
