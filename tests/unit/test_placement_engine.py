"""The placement engine decides exactly as `place` over its positions, whatever happened to them.

Random clusters (whole GPUs, MIG devices, mixed models, cordoned and MPS-less nodes) change position by
position (pods taken and given back, nodes gone and back, whole resets); after every step the engine's choice,
GPUs, verdicts and refusals are compared with `place` and the policy's own answers, in each of its modes:
refusals kept (the extender), scores only (by identity, and by value as the simulator interns), and with a
state table small enough to start over while in use.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from app.core.isolation import MemoryEnforcement, Sharing
from app.core.model import Allocation, Demand, Gpu, Node
from app.core.placement import Placement, Policy, place, registry
from app.core.placement.engine import Engine, HeadroomStanding, RefusalStanding
from tests.unit.test_placement_fragaware_array import DEMANDS, random_node

POLICIES = ("binpack", "spread", "fgd", "fragaware")
MODES = ("refusals", "scores", "by-value", "small")
NewNode = Callable[[random.Random, int], Node]


def changed(rng: random.Random, node: Node) -> Node:
    """The node after a pod came or went: a share on one whole GPU, or host CPU taken or given back."""
    whole = [g for g in node.gpus if not g.mig_profile]
    if whole and rng.random() < 0.7:
        g = rng.choice(whole)
        milli = rng.choice((-200, -100, 100, 250)) if g.milli_used else rng.choice((100, 250, 500, 1000))
        milli = max(-g.milli_used, min(milli, 1000 - g.milli_used))
        mib = max(-g.memory_used_mib, milli * g.memory_mib // 1000)
        return node.reserve((Allocation(node.name, (g.index,), (), milli, mib),))
    cpu = rng.choice((-4000, 4000))
    return replace(node, cpu_milli_free=None if node.cpu_milli_free is None else node.cpu_milli_free + cpu)


def agrees(engine: Engine, nodes: list[Node | None], demand: Demand) -> None:
    policy = engine.policy
    present = [n for n in nodes if n is not None]
    expected = place(present, demand, policy)
    shape = engine.shape(demand)
    i = engine.best(shape)
    if not isinstance(expected, Placement):
        assert i is None, (demand, nodes[i] if i is not None else None)
        return
    assert i is not None and nodes[i] is expected.node, demand
    assert engine.gpus(i, demand) == expected.gpus
    if isinstance(engine.standing, RefusalStanding):
        for k, node in enumerate(nodes):
            v = shape.verdicts[k]
            if node is None:
                assert v is None and k not in shape.refused
                continue
            assert v is not None
            reason = policy.filter(node, demand)
            assert v.reason == reason
            if reason is None:
                assert v.score == policy.score(node, demand) and k not in shape.refused
            else:
                assert shape.refused[k][0] == reason


def engine_in(mode: str, policy: Policy) -> Engine:
    if mode == "by-value":
        return Engine(policy, HeadroomStanding(), by_value=True)
    if mode == "scores":
        return Engine(policy, HeadroomStanding())
    if mode == "small":
        return Engine(policy, states_size=40, max_shapes=3)
    return Engine(policy)


def churn(engine: Engine, rng: random.Random, new_node: NewNode, demands: Sequence[Demand]) -> None:
    """Positions change for 300 steps (pods, nodes gone and back, relists); the engine agrees after each."""
    nodes: list[Node | None] = [new_node(rng, i) for i in range(60)]
    engine.reset(nodes)
    for step in range(300):
        roll = rng.random()
        if roll < 0.02:  # a relist: every position anew, most nodes the same objects as before
            nodes = [n if n is None or rng.random() < 0.8 else changed(rng, n) for n in nodes]
            engine.reset(nodes)
        else:
            for _ in range(rng.choice((1, 1, 2, 20))):  # sometimes a batch: the array pass
                k = rng.randrange(len(nodes))
                node = nodes[k]
                if node is None:
                    node = new_node(rng, k)
                elif rng.random() < 0.03:
                    node = None
                else:
                    node = changed(rng, node)
                nodes[k] = node
                engine.set(k, node)
        agrees(engine, nodes, demands[step % len(demands)])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("policy_name", POLICIES)
def test_the_engine_chooses_as_place_while_positions_change(policy_name: str, mode: str) -> None:
    rng = random.Random(f"{policy_name}-{mode}")
    churn(engine_in(mode, registry.create(policy_name)), rng, random_node, DEMANDS)


def node_with_modes(rng: random.Random, i: int) -> Node:
    """A random node whose GPUs report sharing modes and memory enforcement, as agents do."""
    node = random_node(rng, i)
    gpus = tuple(
        replace(
            g, sharing=rng.choice(tuple(Sharing)), memory_enforcement=rng.choice(tuple(MemoryEnforcement))
        )
        for g in node.gpus
    )
    return replace(node, gpus=gpus)


# Pods that ask for an isolation (time-slicing, a memory enforcement level) beside plain shares.
ISOLATED = (
    Demand(1, milli=250, timeslice=True),
    Demand(1, milli=500, memory_enforcement=MemoryEnforcement.PER_CGROUP),
    Demand(1, memory_mib=4096, memory_enforcement=MemoryEnforcement.CLIENT_ENV),
    Demand(2, milli=1000, timeslice=True),
    Demand(1, milli=100),
    Demand(1, milli=810),
)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("policy_name", POLICIES)
def test_the_engine_chooses_as_place_on_gpus_of_every_sharing_mode(policy_name: str, mode: str) -> None:
    """Equal GPUs in other modes are other node states: a closed or exclusive GPU, or one enforcing less
    than a pod requires, never answers for one that suits it (nor the other way round), by value too."""
    rng = random.Random(f"modes-{policy_name}-{mode}")
    churn(engine_in(mode, registry.create(policy_name)), rng, node_with_modes, ISOLATED + DEMANDS)


def test_states_interned_by_value_differ_by_gpu_mode() -> None:
    """Two nodes alike but for one GPU's sharing mode: a time-slicing pod fits only the one not exclusive."""
    policy = registry.create("binpack")
    engine = Engine(policy, HeadroomStanding(), by_value=True)
    gpus = (Gpu(0, "A100-40GB", 40960, sharing=Sharing.EXCLUSIVE),)
    exclusive = Node("a", gpus)
    shared = Node("b", (replace(gpus[0], sharing=Sharing.SHARED),))
    engine.reset([exclusive, shared])
    assert engine.choose(Demand(1, milli=300, timeslice=True)) == 1
    assert engine.choose(Demand(1, milli=300)) == 0  # both fit: the first position


def test_a_shape_far_behind_the_log_judges_every_position_again() -> None:
    """The log keeps only the last n changes once it grows past its bound; a shape asked after more than
    that judges every node again rather than trusting what it saw."""
    rng = random.Random(3)
    policy = registry.create("fragaware")
    engine = Engine(policy)
    nodes: list[Node | None] = [random_node(rng, i) for i in range(8)]
    engine.reset(nodes)
    rare, often = DEMANDS[0], DEMANDS[3]
    agrees(engine, nodes, rare)
    for _ in range(8 * len(nodes) + 4096 + 50):
        k = rng.randrange(len(nodes))
        node = nodes[k]
        nodes[k] = node = changed(rng, node) if node is not None else random_node(rng, k)
        engine.set(k, node)
        if rng.random() < 0.01:
            agrees(engine, nodes, often)
    assert len(engine.log) <= 8 * len(nodes) + 4096
    agrees(engine, nodes, rare)


def test_refusals_need_states_interned_by_identity() -> None:
    with pytest.raises(ValueError, match="refusal names its node"):
        Engine(registry.create("binpack"), by_value=True)
    with pytest.raises(ValueError, match="RefusalStanding"):
        Engine(registry.create("binpack"), HeadroomStanding()).place(
            [random_node(random.Random(1), 0)], DEMANDS[0]
        )


@pytest.mark.parametrize("policy_name", ["spread", "binpack"])
def test_a_small_cluster_churning_long_keeps_every_node_in_reach(policy_name: str) -> None:
    """Many departures on a few nodes: stale heap entries pile up and are dropped, except those a lazy
    shape still needs as bounds (a node that only shrank keeps its old entry until it reaches the top)."""
    rng = random.Random(policy_name)
    policy = registry.create(policy_name)
    engine = Engine(policy, HeadroomStanding(), by_value=True)
    nodes: list[Node | None] = [random_node(rng, i) for i in range(6)]
    engine.reset(nodes)
    for step in range(13000):  # past the log bound (8n + 4096) three times: trimmed, heaps compacted
        k = rng.randrange(len(nodes))
        node = nodes[k]
        nodes[k] = node = changed(rng, node) if node is not None else random_node(rng, k)
        engine.set(k, node)
        agrees(engine, nodes, DEMANDS[step % 3])


def test_nodes_that_only_fill_stay_in_reach_past_the_log_bound() -> None:
    """Spread's stale entries are bounds while nodes only fill: dropping them with the log's old changes
    would lose those nodes for good (nothing gives them room back)."""
    rng = random.Random(7)
    policy = registry.create("spread")
    engine = Engine(policy, HeadroomStanding(), by_value=True)
    gpus = tuple(Gpu(g, "A100-40GB", 40960) for g in range(8))
    nodes: list[Node | None] = [Node(f"n{i}", gpus) for i in range(6)]
    engine.reset(nodes)
    demand = Demand(1, milli=100)
    for step in range(8 * len(nodes) + 4096 + 500):
        best = engine.choose(demand)
        k = best if best is not None and step % 2 else rng.randrange(len(nodes))  # the choice fills too
        node = nodes[k]
        assert node is not None
        nodes[k] = node = node.reserve((Allocation(node.name, (rng.randrange(8),), (), 1, 1),))
        engine.set(k, node)
        agrees(engine, nodes, demand)


def test_a_long_lived_engine_keeps_only_the_states_its_positions_hold() -> None:
    """Every change of a node is a new state; an extender sees thousands an hour on a few nodes. The table
    stays within its size, and when full forgets only what no position holds: the positions' answers stay
    remembered (no pass judges them again)."""
    rng = random.Random(11)
    engine = Engine(registry.create("fragaware"), states_size=64)
    nodes: list[Node | None] = [random_node(rng, i) for i in range(8)]
    engine.reset(nodes)
    demand = DEMANDS[0]
    for step in range(2000):
        k = rng.randrange(len(nodes))
        node = nodes[k]
        nodes[k] = node = changed(rng, node) if node is not None else random_node(rng, k)
        engine.set(k, node)
        if step % 7 == 0:
            agrees(engine, nodes, demand)
        assert len(engine._interned) <= 64
    agrees(engine, nodes, demand)  # every position judged for the demand
    held = engine.state[:]
    engine._forget_states()
    live = {s for s in held if s >= 0}
    assert engine.state == held and len(engine._interned) == len(live)
    assert all(engine.intern(n) == s for n, s in zip(nodes, held, strict=True) if n is not None)
    assert all(s in engine.shapes[demand].memo for s in live)  # their answers kept
    agrees(engine, nodes, demand)
