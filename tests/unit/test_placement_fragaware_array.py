"""FragAware's array form judges every node exactly as the policy does one node at a time.

Random clusters mix what the pass models (whole GPUs of one kind: fractions, memory shares, whole and
multi-GPU demands, unhealthy GPUs, CPU- and memory-limited hosts, foreign memory use) with what it hands
back to the policy (MIG devices, mixed models, cordoned and MPS-less nodes); every answer it gives must
be the policy's own, float for float, refusals field for field.
"""

from __future__ import annotations

import random

import pytest

from app.core.explain import reason_text
from app.core.model import Allocation, Demand, Gpu, Node
from app.core.placement import registry
from app.core.placement.base import Judged, Policy
from app.core.placement.engine import Engine, RefusalStanding
from app.core.placement.fragaware import GPUPACK_OPTIONS, FragAware, FragOptions
from app.core.placement.workload import PodShape, TargetWorkload, default_workload

DEMANDS = (
    Demand(1, milli=100),
    Demand(1, milli=250, cpu_milli=4000),
    Demand(1, milli=500, host_memory_mib=2048),
    Demand(1, milli=810),
    Demand(1, memory_mib=4096),
    Demand(1, memory_mib=30000, cpu_milli=12000),
    Demand(1, milli=1000, cpu_milli=8000),
    Demand(2, milli=1000),
    Demand(2, milli=600),
    Demand(3, memory_mib=8000),
    Demand(1, milli=300, models=frozenset({"A100-40GB"})),
    Demand(1, milli=300, models=frozenset({"H100-80GB"})),
    Demand(1, milli=200, needs_mps=True),
)


def judge(nodes: list[Node], demand: Demand, policy: Policy) -> list[Judged | None]:
    """The array form the registry finds for `policy` on `nodes` (all None where it declares none)."""
    form = registry.array_form(policy)
    if form is None:
        return [None] * len(nodes)
    return form.judge(nodes, [form.read(n) for n in nodes], demand)


def random_gpu(rng: random.Random, index: int, model: str, memory: int) -> Gpu:
    used = rng.choice((0, 0, 0, 1000, rng.randrange(0, 1001, 10), rng.randrange(0, 1001)))
    return Gpu(
        index,
        model,
        memory,
        milli_used=used,
        memory_used_mib=used * memory // 1000,
        foreign_mib=rng.choice((0, 0, 0, 0, 512, rng.randrange(0, memory))),
        healthy=rng.random() > 0.1,
        utilization_percent=rng.choice((None, rng.randrange(100))),
    )


def random_node(rng: random.Random, i: int) -> Node:
    model, memory = rng.choice((("A100-40GB", 40960), ("H100-80GB", 81920), ("T4", 15360)))
    n = rng.choice((1, 2, 4, 8, 8))
    gpus = [random_gpu(rng, g, model, memory) for g in range(n)]
    odd = rng.random()
    if odd < 0.05:  # a MIG device among the GPUs
        gpus.append(Gpu(100 * n + 100, model, 10240, mig_profile="1g.10gb", parent=n))
    elif odd < 0.08:  # GPUs of two models
        gpus.append(random_gpu(rng, n, "T4", 15360))
    elif odd < 0.1:
        gpus = []
    return Node(
        f"n{i}",
        tuple(gpus),
        cpu_milli_free=rng.choice((None, rng.randrange(0, 96_000), rng.randrange(0, 16_000))),
        memory_mib_free=rng.choice((None, rng.randrange(0, 512_000), rng.randrange(0, 4096))),
        schedulable=rng.random() > 0.05,
        unschedulable_reason="cordoned",
        mps=rng.random() > 0.1,
        mps_reason="no daemon",
    )


# Shapes only some models can host (FGD's gpu_spec), and a CPU-only one: the frag sum's other branches.
BY_MODEL = TargetWorkload(
    (
        PodShape(4000, 500, 1, frozenset({"A100-40GB"}), 0.3),
        PodShape(8000, 1000, 2, frozenset({"H100-80GB"}), 0.2),
        PodShape(2000, 250, 1, frozenset(), 0.3),
        PodShape(16000, 0, 0, frozenset(), 0.2),
    )
)

# GPU shapes pinned to A100 alone or to a `|` set: on an H100 only the CPU-only shape and the set land
# (a part of its own), and nothing but the CPU-only shape lands on a T4 (no settle table, no CPU ratio).
# On a fleet with few A100s, the A100 is scarce for the set's pods and for unpinned demands.
PINNED = TargetWorkload(
    (
        PodShape(4000, 470, 1, frozenset({"A100-40GB"}), 0.35),
        PodShape(12000, 1000, 1, frozenset({"A100-40GB"}), 0.25),
        PodShape(6000, 250, 1, frozenset({"A100-40GB", "H100-80GB"}), 0.25),
        PodShape(16000, 0, 0, frozenset(), 0.15),
    ),
    fleet=(("A100-40GB", 300), ("H100-80GB", 200), ("T4", 100)),
)

POLICIES = {
    "by-model": lambda: FragAware(BY_MODEL, options=GPUPACK_OPTIONS),
    "pinned": lambda: FragAware(PINNED, options=GPUPACK_OPTIONS),
    "fragaware": lambda: registry.create("fragaware"),
    "fgd": lambda: registry.create("fgd"),
    "settle-only": lambda: FragAware(default_workload(), options=FragOptions(settle_weight=0.5)),
    "strand-only": lambda: FragAware(default_workload(), options=FragOptions(strand_weight=0.7)),
}


@pytest.mark.parametrize("policy_name", sorted(POLICIES))
@pytest.mark.parametrize("seed", range(6))
def test_the_pass_answers_as_the_policy(policy_name: str, seed: int) -> None:
    rng = random.Random(seed)
    policy = POLICIES[policy_name]()
    nodes = [random_node(rng, i) for i in range(300)]
    answered = 0
    for demand in DEMANDS:
        got = judge(nodes, demand, policy)
        for node, answer in zip(nodes, got, strict=True):
            if answer is None:
                continue
            answered += 1
            reason = policy.filter(node, demand)
            if reason is not None:
                assert answer == reason, (node, demand)
            else:
                assert answer == policy.score(node, demand), (node, demand)
    assert answered > 0.5 * len(nodes) * len(DEMANDS)  # the pass answers for most nodes (host refusals aside)


def test_the_pass_scores_bench_like_nodes_exactly() -> None:
    """8 GPUs each with many small resident shares: nearly every node state distinct, scores spread."""
    rng = random.Random(3)
    policy = registry.create("fragaware")
    nodes = []
    for i in range(400):
        used = [sum(rng.choice((20, 50, 80, 100)) for _ in range(rng.randrange(0, 13))) for _ in range(8)]
        gpus = tuple(Gpu(g, "A100-40GB", 40960, milli_used=min(u, 1000)) for g, u in enumerate(used))
        nodes.append(Node(f"n{i}", gpus, cpu_milli_free=rng.randrange(2000, 128_000)))
    for milli in (100, 250, 500, 1000):
        for count in (1, 2) if milli == 1000 else (1,):
            demand = Demand(count, milli=milli, cpu_milli=2000)
            got = judge(nodes, demand, policy)
            assert all(a is not None for a in got)
            want = [policy.filter(n, demand) or policy.score(n, demand) for n in nodes]
            assert got == want


def test_other_policies_and_mig_demands_are_left_to_the_policy() -> None:
    nodes = [random_node(random.Random(1), i) for i in range(20)]
    assert set(judge(nodes, Demand(1, milli=100), registry.create("binpack"))) == {None}
    mig = Demand(1, memory_mib=10240, mig=True)
    assert set(judge(nodes, mig, registry.create("fragaware"))) == {None}


class OneByOne(FragAware):
    """The same policy, which the pass does not cover (another type): judged node by node."""


def test_the_engine_with_the_array_form_equals_one_judged_node_by_node() -> None:
    rng = random.Random(11)
    nodes = [random_node(rng, i) for i in range(400)]
    workload = default_workload()
    fast_policy = FragAware(workload, options=GPUPACK_OPTIONS)
    slow_policy = OneByOne(workload, options=GPUPACK_OPTIONS)
    fast = Engine(fast_policy, RefusalStanding(reason_text))
    slow = Engine(slow_policy, RefusalStanding(reason_text))
    assert fast.array is not None and slow.array is None
    for demand in DEMANDS:
        assert fast.array.covers(demand) or demand.mig
        for e in (fast, slow):
            e.reset(nodes)
        a, b = fast.shape(demand), slow.shape(demand)
        assert [(v.reason, v.score) if v else None for v in a.verdicts] == [
            (v.reason, v.score) if v else None for v in b.verdicts
        ]
        assert a.refused == b.refused
        assert fast.best(a) == slow.best(b)
        # Many nodes change at once (a relist): judged again in one pass, still the same answers.
        for e in (fast, slow):
            for i in range(100):
                e.set(i, nodes[i].reserve(()).charge_host(1000, 0))
        a, b = fast.shape(demand), slow.shape(demand)
        assert a.refused == b.refused
        assert fast.best(a) == slow.best(b)


def test_reads_kept_per_node_state_follow_changed_nodes() -> None:
    """A node that took a pod is a new object: its GPUs are read again, never answered from the old read."""
    rng = random.Random(5)
    policy = registry.create("fragaware")
    engine = Engine(policy, states_size=50)  # small: the table also starts over while in use
    form = engine.array
    assert form is not None
    nodes = [random_node(rng, i) for i in range(40)]
    for step in range(6):
        demand = DEMANDS[step % len(DEMANDS)]
        got = form.judge(nodes, [engine.read(n) for n in nodes], demand)
        for node, answer in zip(nodes, got, strict=True):
            if answer is not None:
                assert answer == (policy.filter(node, demand) or policy.score(node, demand))
        nodes = [
            n.reserve((Allocation(n.name, (n.gpus[0].index,), (), 100, 1024),)) if n.gpus and k % 2 else n
            for k, n in enumerate(nodes)
        ]


def test_a_new_shape_after_a_few_nodes_took_pods_answers_as_judged_node_by_node() -> None:
    """Each new shape's pass takes what no demand changes (the GPUs' numbers, the fragmentation before a
    pod lands) from the last pass for the nodes that did not change: its answers stay the policy's."""
    rng = random.Random(17)
    nodes = [random_node(rng, i) for i in range(300)]
    fast = Engine(FragAware(default_workload(), options=GPUPACK_OPTIONS), RefusalStanding(reason_text))
    slow = Engine(OneByOne(default_workload(), options=GPUPACK_OPTIONS), RefusalStanding(reason_text))
    for e in (fast, slow):
        e.reset(nodes)
    fast.prepare()  # as the extender at Ready: the first shape finds the nodes worked out
    for step, demand in enumerate(DEMANDS):
        # A few nodes took or gave back a pod since the last shape (their reads are new), in a new order.
        for i in rng.sample(range(len(nodes)), 10 * step % 70):
            node = nodes[i]
            whole = [g for g in node.gpus if not g.mig_profile and g.milli_used <= 900]
            if whole:
                g = rng.choice(whole)
                nodes[i] = node.reserve((Allocation(node.name, (g.index,), (), 100, 1024),))
            else:
                nodes[i] = node.charge_host(2000, 0)
        if step % 3 == 2:
            rng.shuffle(nodes)
        for e in (fast, slow):
            e.reset(nodes)
        a, b = fast.shape(demand), slow.shape(demand)
        assert list(a.verdicts) == list(b.verdicts), demand
        assert a.refused == b.refused, demand
        assert fast.best(a) == slow.best(b), demand
