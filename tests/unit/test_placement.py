"""Placement policies: fit reasons, GPU choice, tie-breaking, registry, never over-committing."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.errors import PlacementReason, ReasonKind, Shortfall
from app.core.model import Demand, Gpu, Node
from app.core.placement import (
    Placement,
    Policy,
    Registry,
    TargetWorkload,
    normalize_scores,
    place,
    registry,
    score_nodes,
    to_allocation,
)
from app.core.placement.fit import node_misfit
from app.core.placement.workload import PodShape, default_workload

T4_MIB = 15109
POLICIES = ("binpack", "spread", "fgd", "fragaware")


def make_node(
    name: str,
    used: Sequence[int],
    *,
    model: str = "T4",
    memory_mib: int = T4_MIB,
    live: Sequence[int | None] | None = None,
    foreign: Sequence[int] | None = None,
    util: Sequence[int | None] | None = None,
    healthy: Sequence[bool] | None = None,
    cpu: int | None = None,
    mem: int | None = None,
) -> Node:
    """A node whose GPU i has `used[i]` milli reserved (and the same share of memory)."""
    gpus = tuple(
        Gpu(
            index=i,
            model=model,
            memory_mib=memory_mib,
            uuid=f"GPU-{name}-{i}",
            milli_used=u,
            memory_used_mib=u * memory_mib // 1000,
            live_free_mib=None if live is None else live[i],
            foreign_mib=0 if foreign is None else foreign[i],
            utilization_percent=None if util is None else util[i],
            healthy=True if healthy is None else healthy[i],
        )
        for i, u in enumerate(used)
    )
    return Node(name, gpus, cpu_milli_free=cpu, memory_mib_free=mem)


def frac(
    milli: int,
    count: int = 1,
    *,
    models: frozenset[str] = frozenset(),
    cpu_milli: int = 0,
    host_memory_mib: int = 0,
) -> Demand:
    return Demand(
        count=count, milli=milli, models=models, cpu_milli=cpu_milli, host_memory_mib=host_memory_mib
    )


WORKLOAD = TargetWorkload(
    (
        PodShape(0, 1000, 1, frozenset(), 0.4),
        PodShape(0, 470, 1, frozenset(), 0.3),
        PodShape(0, 810, 1, frozenset(), 0.2),
        PodShape(2000, 0, 0, frozenset(), 0.1),
    )
)


def policy(name: str) -> Policy:
    return registry.create(name, WORKLOAD)


@pytest.mark.parametrize(
    ("node", "demand", "reason"),
    [
        pytest.param(
            make_node("n", [750, 900]), frac(500), "n: no GPU with 0.50 free: best has 0.25", id="milli"
        ),
        pytest.param(
            make_node("n", [0]), frac(1000, 2), "n: needs 2 GPUs with 1.00 free: 1 have it", id="count"
        ),
        pytest.param(
            make_node("n", [500], foreign=[7987], memory_mib=16384),
            frac(500),
            "n: no GPU with 8192 MiB free: best has 0 MiB (gpu0: 16384 MiB total, 8192 MiB reserved by"
            " gpupack pods, 7987 MiB used by processes outside gpupack pods, 256 MiB margin)",
            id="foreign-memory",
        ),
        pytest.param(
            make_node("n", [0], model="P100", memory_mib=16280),
            frac(500, models=frozenset({"V100M16", "T4"})),
            "n: GPU model P100 is not one of T4|V100M16",
            id="model",
        ),
        pytest.param(
            make_node("n", [0, 0], healthy=[False, False]), frac(100), "n: no healthy GPU", id="unhealthy"
        ),
        pytest.param(make_node("n", [], cpu=0), frac(100), "n: node has no GPUs", id="no-gpus"),
        pytest.param(
            make_node("n", [0], cpu=1000),
            frac(100, cpu_milli=2000),
            "n: needs 2000 CPU milli: 1000 free",
            id="cpu",
        ),
        pytest.param(
            make_node("n", [0], mem=10),
            frac(100, host_memory_mib=64),
            "n: needs 64 MiB host memory: 10 MiB free",
            id="host-memory",
        ),
        pytest.param(
            make_node("n", [0], memory_mib=1000),
            Demand(count=1, memory_mib=2000),
            "n: no GPU with 2.00 free: best has 1.00",
            id="memory-bigger-than-gpu",
        ),
    ],
)
def test_filter_explains_why_a_node_cannot_fit(node: Node, demand: Demand, reason: str) -> None:
    for name in POLICIES:
        got = policy(name).filter(node, demand)
        assert got is not None
        assert str(got) == reason


def test_reserved_memory_is_checked_separately_from_milli() -> None:
    node = Node("n", (Gpu(index=0, model="T4", memory_mib=16000, milli_used=100, memory_used_mib=15000),))
    assert (
        str(node_misfit(node, Demand(count=1, memory_mib=2000)))
        == "n: no GPU with 2000 MiB free: best has 1000 MiB"
    )


def test_unschedulable_node_reports_its_reason() -> None:
    node = Node(
        "n", make_node("n", [0]).gpus, schedulable=False, unschedulable_reason="agent heartbeat is 5m old"
    )
    assert str(node_misfit(node, frac(100))) == "n: agent heartbeat is 5m old"


@pytest.mark.parametrize(
    ("node", "demand"),
    [
        pytest.param(make_node("n", [500], live=[None]), frac(500), id="live-unknown-is-skipped"),
        pytest.param(make_node("n", [0], live=[8000]), Demand(count=1, memory_mib=7000), id="live-covers"),
        pytest.param(make_node("n", [0], cpu=100), frac(100, cpu_milli=100), id="cpu-exact"),
        pytest.param(make_node("n", [0, 0], healthy=[False, True]), frac(1000), id="one-healthy"),
        pytest.param(make_node("n", [1000]), Demand(count=0, cpu_milli=5), id="cpu-only-pod"),
    ],
)
def test_filter_accepts(node: Node, demand: Demand) -> None:
    for name in POLICIES:
        assert policy(name).filter(node, demand) is None


@pytest.mark.parametrize(
    ("name", "used", "demand", "gpus"),
    [
        pytest.param(
            "binpack", [0, 600, 300, 600], frac(400), (1,), id="binpack-fullest-fitting-first-index"
        ),
        pytest.param("binpack", [0, 500, 0, 0], frac(1000, 2), (0, 2), id="binpack-whole-first-free"),
        pytest.param("spread", [200, 600, 0, 600], frac(400), (2,), id="spread-emptiest"),
        pytest.param("fgd", [0, 530, 0, 0], frac(470), (1,), id="fgd-fills-the-pair"),
        pytest.param("fragaware", [0, 530, 0, 0], frac(470), (1,), id="fragaware-fills-the-pair"),
        pytest.param("fragaware", [190, 0, 0, 0], frac(810), (0,), id="fragaware-810-into-its-hole"),
    ],
)
def test_choose_gpus(name: str, used: list[int], demand: Demand, gpus: tuple[int, ...]) -> None:
    node = make_node("n", used)
    assert policy(name).choose_gpus(node, demand) == gpus


def test_binpack_prefers_the_fuller_node_and_spread_the_emptier() -> None:
    nodes = [make_node("empty", [0, 0]), make_node("half", [500, 0])]
    for name, want in (("binpack", "half"), ("spread", "empty")):
        got = place(nodes, frac(300), policy(name))
        assert isinstance(got, Placement)
        assert got.node.name == want


def test_binpack_score_is_the_truncated_bestfit_formula() -> None:
    node = make_node("n", [0] * 8, cpu=96000)
    # 100 * (1 - (0.5 * 92000/128000 + 0.5 * 7500/8000)) = 17.19 -> 17
    assert policy("binpack").score(node, frac(500, cpu_milli=4000)) == 17


@pytest.mark.parametrize("name", POLICIES)
def test_ties_go_to_the_first_node_in_order(name: str) -> None:
    nodes = [make_node(f"n{i}", [0, 0]) for i in range(4)]
    for order in (nodes, nodes[::-1]):
        got = place(order, frac(300), policy(name))
        assert isinstance(got, Placement)
        assert got.node is order[0]


def test_place_returns_every_reason_when_nothing_fits() -> None:
    nodes = [make_node("a", [900]), make_node("b", [1000, 1000])]
    got = place(nodes, frac(200), policy("fragaware"))
    assert got == (
        PlacementReason("a", None, Shortfall.GPU_SHARE, needed=200, free=100),
        PlacementReason("b", None, Shortfall.GPU_SHARE, needed=200, free=0),
    )
    assert [(r.kind, r.rule) for r in got] == [
        (ReasonKind.CAPACITY, "no GPU with 0.20 free: best has 0.10"),
        (ReasonKind.CAPACITY, "no GPU with 0.20 free: best has 0.00"),
    ]


def test_score_nodes_and_normalize() -> None:
    nodes = [make_node("a", [0, 0]), make_node("b", [500, 0]), make_node("full", [1000])]
    raw = score_nodes(nodes, frac(500), policy("spread"))
    assert raw == {"a": 0.75, "b": 0.5, "full": None}
    assert normalize_scores(raw) == {"a": 10, "b": 0, "full": 0}
    assert normalize_scores({"x": 3.0, "y": 3.0}) == {"x": 10, "y": 10}


def test_to_allocation_uses_the_gpu_models_memory() -> None:
    node = make_node("n", [0, 0, 0])
    alloc = to_allocation(node, frac(250, 2), (0, 2))
    assert (alloc.gpu_indexes, alloc.gpu_uuids, alloc.milli, alloc.memory_mib) == (
        (0, 2),
        ("GPU-n-0", "GPU-n-2"),
        250,
        3777,
    )


def test_registry_can_be_replaced_in_tests() -> None:
    class Fake:
        name = "fake"

        def filter(self, node: Node, demand: Demand) -> PlacementReason | None:
            return None

        def score(self, node: Node, demand: Demand) -> float:
            return float(len(node.name))

        def choose_gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
            return (0,)

    with registry.replaced({"fake": lambda _: Fake()}) as reg:
        assert reg.names() == ("fake",)
        got = place([make_node("a", [0]), make_node("bb", [0])], frac(100), reg.create("fake"))
        assert isinstance(got, Placement)
        assert got.node.name == "bb"
    assert "fragaware" in registry.names()
    with pytest.raises(KeyError, match="unknown placement policy 'nope'; known: "):
        Registry().create("nope")


def test_default_workload_loads_and_is_a_distribution() -> None:
    from app.core.placement import default_workload

    wl = default_workload()
    assert len(wl.shapes) > 10
    assert abs(sum(s.weight for s in wl.shapes) - 1) < 1e-9


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param({}, "shapes: must be a list", id="no-shapes"),
        pytest.param({"shapes": [1]}, "shapes[0]: must be an object", id="not-object"),
        pytest.param(
            {"shapes": [{"cpu_milli": 0, "gpu_milli": -1, "num_gpu": 1, "weight": 1}]},
            "shapes[0].gpu_milli=-1: must be a non-negative integer",
            id="negative",
        ),
        pytest.param(
            {"shapes": [{"cpu_milli": 0, "gpu_milli": 100, "num_gpu": 1, "weight": 0}]},
            "shapes[0].weight=0: must be a positive number",
            id="zero-weight",
        ),
        pytest.param(
            {"shapes": [{"cpu_milli": 0, "gpu_milli": 1500, "num_gpu": 1, "weight": 1}]},
            "milli=1500: must be in [0, 1000]",
            id="too-big",
        ),
        pytest.param({"shapes": []}, "shapes: must not be empty", id="empty"),
    ],
)
def test_workload_json_is_validated(raw: object, message: str) -> None:
    with pytest.raises(ValueError, match=r"^wl: ") as err:
        TargetWorkload.from_json(raw, source="wl")
    assert message in str(err.value)


def test_workload_keeps_the_most_common_shapes_up_to_coverage() -> None:
    demands = [frac(1000)] * 6 + [frac(500)] * 3 + [frac(100)]
    wl = TargetWorkload.from_demands(demands, coverage=0.9)
    assert [(s.milli, round(s.weight, 3)) for s in wl.shapes] == [(1000, 0.667), (500, 0.333)]


def test_node_frag_counts_holes_too_small_for_each_shape() -> None:
    # 810-shape (p=.2) cannot use the 530 hole; 470 (.3) and 1000 (.4) are hostable elsewhere;
    # CPU-only (.1) wastes every free milli.
    frag = WORKLOAD.node_frag(None, (530, 1000), "T4")
    assert frag == pytest.approx(0.4 * 530 + 0.3 * 0 + 0.2 * 530 + 0.1 * 1530)


def _frag_by_definition(wl: TargetWorkload, cpu: int | None, lefts: Sequence[int], model: str) -> float:
    """FGD's expected fragmentation, literally: shape by shape, in the workload's order."""
    total, frag = sum(lefts), 0.0
    for s in wl.shapes:
        hostable = s.count > 0 and (not s.models or model in s.models)
        if hostable and (cpu is None or cpu >= s.cpu_milli) and sum(x >= s.milli for x in lefts) >= s.count:
            frag += s.weight * sum(x for x in lefts if x < s.milli)
        else:
            frag += s.weight * total
    return frag


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=-50, max_value=1000), max_size=8),
    st.one_of(st.none(), st.integers(0, 200_000)),
    st.sampled_from(["T4", "V100M32", "A100-40GB", "G2"]),
)
def test_node_frag_is_bit_for_bit_the_definition(lefts: list[int], cpu: int | None, model: str) -> None:
    wl = default_workload()
    # Unsorted input and a memo hit answer the same float as the shape-by-shape sum (==, not approx:
    # scores truncate, so a last-bit difference could move a placement).
    assert wl.node_frag(cpu, tuple(lefts), model) == _frag_by_definition(wl, cpu, lefts, model)
    assert wl.node_frag(cpu, tuple(sorted(lefts)), model) == _frag_by_definition(wl, cpu, lefts, model)


SHAPES = [(4000, 500, 1), (8000, 1000, 1), (12000, 470, 1), (0, 0, 0), (16000, 1000, 2), (8000, 250, 1)]
CPU_STEPS = TargetWorkload.from_json(
    {"shapes": [{"cpu_milli": c, "gpu_milli": m, "num_gpu": n, "weight": 1} for c, m, n in SHAPES]}
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=1000), max_size=8),
    st.integers(0, 40_000),
    st.integers(0, 40_000),
    st.sampled_from(["T4", "V100M32", "G2"]),
)
def test_node_frag_memo_shared_between_cpu_values_answers_each_by_definition(
    lefts: list[int], cpu: int, other: int, model: str
) -> None:
    # The memo keys free CPU by the shapes' CPU steps: whichever CPU value filled the entry, every
    # other CPU value gets its own definition's float.
    wl, ratio = CPU_STEPS, CPU_STEPS.cpu_per_milli
    assert ratio is not None
    for value in (cpu, other, cpu):
        assert wl.node_frag(value, tuple(sorted(lefts)), model) == _frag_by_definition(
            wl, value, lefts, model
        )
        settled = wl.settled_waste()
        usable = sum(x - settled[x] for x in sorted(lefts))
        assert wl.cpu_stranded(value, tuple(sorted(lefts)), model) == max(0.0, usable - value / ratio)


# --- invariants -----------------------------------------------------------------------------------------

gpu_used = st.integers(min_value=0, max_value=1000)
nodes_strategy = st.lists(
    st.tuples(
        st.lists(gpu_used, min_size=0, max_size=8),
        st.sampled_from(["T4", "V100M32"]),
        st.one_of(st.none(), st.integers(0, 16000)),
        st.one_of(st.none(), st.integers(0, 20000)),
    ),
    min_size=1,
    max_size=6,
)
demand_strategy = st.one_of(
    st.builds(
        lambda m, c, cpu: Demand(count=c, milli=m, cpu_milli=cpu),
        st.integers(1, 1000),
        st.integers(1, 4),
        st.integers(0, 8000),
    ),
    st.builds(lambda mib: Demand(count=1, memory_mib=mib), st.integers(1, 40000)),
    st.builds(lambda cpu: Demand(count=0, cpu_milli=cpu), st.integers(0, 20000)),
)


def build_nodes(spec: list[tuple[list[int], str, int | None, int | None]]) -> list[Node]:
    mem = {"T4": T4_MIB, "V100M32": 32510}
    out = []
    for i, (used, model, live, cpu) in enumerate(spec):
        # `live` doubles as foreign usage here: some GPUs carry processes outside gpupack pods.
        foreign = [0 if live is None else (live * (j + 1)) % 9000 for j in range(len(used))]
        out.append(make_node(f"n{i}", used, model=model, memory_mib=mem[model], foreign=foreign, cpu=cpu))
    return out


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=60, deadline=None)
@given(spec=nodes_strategy, demands=st.lists(demand_strategy, min_size=1, max_size=12))
def test_placing_a_sequence_never_over_commits_and_is_deterministic(
    name: str, spec: list[tuple[list[int], str, int | None, int | None]], demands: list[Demand]
) -> None:
    nodes = build_nodes(spec)
    pol = policy(name)
    for demand in demands:
        got = place(nodes, demand, pol)
        assert got == place(nodes, demand, policy(name))  # a fresh policy decides the same
        if not isinstance(got, Placement):
            assert len(got) == len(nodes)
            continue
        node, gpus = got
        assert len(gpus) == demand.count == len(set(gpus))
        assert pol.filter(node, demand) is None
        new = []
        for g in node.gpus:
            if g.index not in gpus:
                new.append(g)
                continue
            milli, mib = demand.on(g.memory_mib)
            after = g.reserve(milli, mib)
            assert after.milli_used <= 1000
            assert after.memory_used_mib <= after.memory_mib
            margin = 256 if after.foreign_mib else 0
            assert after.memory_used_mib + after.foreign_mib + margin <= after.memory_mib
            new.append(after)
        cpu = None if node.cpu_milli_free is None else node.cpu_milli_free - demand.cpu_milli
        assert cpu is None or cpu >= 0
        pos = nodes.index(node)
        nodes[pos] = Node(node.name, tuple(new), cpu_milli_free=cpu)


# --- the settled-hole refinement -------------------------------------------------------------------------

PAIRS = TargetWorkload(
    (
        PodShape(0, 470, 1, frozenset(), 0.4),
        PodShape(0, 320, 1, frozenset(), 0.3),
        PodShape(0, 810, 1, frozenset(), 0.2),
        PodShape(0, 0, 0, frozenset(), 0.1),
    )
)


@pytest.mark.parametrize(
    ("shape", "hole", "waste"),
    [
        pytest.param(810, 190, 190.0, id="810-holes-are-never-filled"),
        pytest.param(810, 1000, 190.0, id="every-empty-gpu-ends-with-an-810-hole"),
        pytest.param(500, 500, 0.0, id="halves-pair-up"),
        pytest.param(500, 1000, 0.0, id="halves-fill-whole-gpus"),
    ],
)
def test_settled_waste_of_single_shape_workloads(shape: int, hole: int, waste: float) -> None:
    wl = TargetWorkload((PodShape(0, shape, 1, frozenset(), 1.0),))
    assert wl.settled_waste(pool_gpus=500)[hole] == waste


def test_settled_waste_is_deterministic_and_ranks_holes_by_how_well_they_fill() -> None:
    v = PAIRS.settled_waste(pool_gpus=2000)
    assert v == TargetWorkload(PAIRS.shapes).settled_waste(pool_gpus=2000)
    assert v[210] == 210.0  # nothing in the workload fits 210
    assert v[360] < v[530] < v[210]


def test_fragaware_keeps_the_470_hole_that_fgd_spends_on_a_320() -> None:
    # GPU 0 has 530 free (after a 470), GPU 1 has 680 (after a 320). FGD puts the next 320 into the
    # 530 hole, leaving 210 that nothing fills; fragaware starts the 320 triple on GPU 1.
    node = make_node("n", [470, 320])
    demand = frac(320)
    assert registry.create("fgd", PAIRS).choose_gpus(node, demand) == (0,)
    assert registry.create("fragaware", PAIRS).choose_gpus(node, demand) == (1,)


# --- the CPU-stranding refinement ------------------------------------------------------------------------

WHOLE_8_CORES = TargetWorkload(
    (
        PodShape(8000, 1000, 1, frozenset(), 0.9),
        PodShape(4000, 0, 0, frozenset(), 0.1),
    )
)


def test_stranded_milli_is_what_the_free_cpu_cannot_feed() -> None:
    # Whole-GPU pods bring 8 CPU milli per GPU milli; every empty GPU gets used (V[1000] = 0).
    assert WHOLE_8_CORES.cpu_per_milli == 8.0
    assert WHOLE_8_CORES.cpu_stranded(18000, (1000, 1000), "T4") == 0.0  # 2 GPUs need 16000
    assert WHOLE_8_CORES.cpu_stranded(14000, (1000, 1000), "T4") == 250.0
    assert WHOLE_8_CORES.cpu_stranded(None, (1000, 1000), "T4") == 0.0  # CPU not tracked: nothing to say


def test_fragaware_keeps_cpu_for_the_gpus_of_a_cpu_tight_node() -> None:
    # A CPU-only pod: node a would keep 14 of the 16 cores its two empty GPUs need, node b has plenty.
    # FGD sees no change on either (a whole-GPU pod still fits on a) and takes a, first in order;
    # fragaware sends the pod to b, so a can still sell both GPUs.
    nodes = [make_node("a", [0, 0], cpu=18000), make_node("b", [0, 0], cpu=100000)]
    demand = Demand(count=0, cpu_milli=4000)
    chosen = {p: place(nodes, demand, registry.create(p, WHOLE_8_CORES)) for p in ("fgd", "fragaware")}
    assert isinstance(chosen["fgd"], Placement) and chosen["fgd"].node.name == "a"
    assert isinstance(chosen["fragaware"], Placement) and chosen["fragaware"].node.name == "b"


@pytest.mark.parametrize("name", ["fgd", "fragaware"])
def test_choose_gpus_after_score_answers_as_a_fresh_policy_in_every_thread(name: str) -> None:
    # The evaluation a thread remembers from score() answers choose_gpus() only for the same node object
    # and demand: other nodes, other demands and other threads get their own answer.
    from concurrent.futures import ThreadPoolExecutor

    nodes = [make_node(f"n{i}", used, cpu=cpu) for i, (used, cpu) in enumerate(SHARED_STATES)]
    demands = [Demand(count=1, milli=m, cpu_milli=4000) for m in (250, 470, 500, 1000)]
    demands.append(Demand(count=2, milli=1000, cpu_milli=8000))
    shared = registry.create(name, CPU_STEPS)

    def answers(order: int) -> list[tuple[float, tuple[int, ...]]]:
        out = []
        for demand in demands[order:] + demands[:order]:
            fitting = [n for n in nodes if shared.filter(n, demand) is None]
            out += [(shared.score(n, demand), ()) for n in fitting]
            out += [(-1.0, shared.choose_gpus(n, demand)) for n in reversed(fitting)]
        return out

    def fresh(order: int) -> list[tuple[float, tuple[int, ...]]]:
        out = []
        for demand in demands[order:] + demands[:order]:
            fitting = [n for n in nodes if shared.filter(n, demand) is None]
            out += [(registry.create(name, CPU_STEPS).score(n, demand), ()) for n in fitting]
            out += [
                (-1.0, registry.create(name, CPU_STEPS).choose_gpus(n, demand)) for n in reversed(fitting)
            ]
        return out

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(answers, [0, 1, 2, 3] * 4))
    assert got == [fresh(o) for o in [0, 1, 2, 3] * 4]
    assert any(gpus for run in got for _, gpus in run)


SHARED_STATES = [([0, 0], 40000), ([500, 0], 40000), ([0, 530], 9000), ([750, 750, 0, 0], 30000), ([0], None)]


def _share_choice_by_definition(policy: Policy, node: Node, demand: Demand) -> tuple[float, tuple[int, ...]]:
    """FragAware's single-GPU share choice, literally: fitting GPUs in tie order, the first best wins."""
    from app.core.placement.fit import fitting_gpus
    from app.core.placement.fragaware import score_of

    wl, lefts, cpu = CPU_STEPS, node.whole_lefts, node.cpu_milli_free
    cpu_after = None if cpu is None else cpu - demand.cpu_milli
    best: tuple[float, tuple[int, ...]] = (-1.0, ())
    for g in fitting_gpus(node, demand):
        milli = demand.on(g.memory_mib)[0]
        after = list(lefts)
        after[after.index(g.milli_free)] -= milli
        after_t = tuple(sorted(after))
        delta = wl.node_frag(cpu, lefts, node.model) - wl.node_frag(cpu_after, after_t, node.model)
        model = node.model
        delta += 0.5 * (wl.cpu_stranded(cpu, lefts, model) - wl.cpu_stranded(cpu_after, after_t, model))
        settled = wl.settled_waste()
        delta += 0.5 * (settled[g.milli_free] - settled[g.milli_free - milli])
        if score_of(delta) > best[0]:
            best = (score_of(delta), (g.index,))
    return best


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0, 250, 470, 500, 530, 750]), st.integers(0, 3)), min_size=1, max_size=8
    ),
    st.one_of(
        st.integers(1, 999).map(lambda m: Demand(count=1, milli=m, cpu_milli=4000)),
        st.integers(1, 15000).map(lambda mib: Demand(count=1, memory_mib=mib, cpu_milli=4000)),
    ),
    st.sampled_from([9000, 40000]),
)
def test_fragaware_share_choice_is_the_first_best_gpu_in_tie_order(
    gpus: list[tuple[int, int]], demand: Demand, cpu: int
) -> None:
    # Equal free shares and utilisations repeat, so ties are common: the least utilised, then lowest index.
    node = make_node("n", [u for u, _ in gpus], util=[10 * x for _, x in gpus], cpu=cpu)
    policy = registry.create("fragaware", CPU_STEPS)
    if policy.filter(node, demand) is None:
        want = _share_choice_by_definition(policy, node, demand)
        assert (policy.score(node, demand), policy.choose_gpus(node, demand)) == want
