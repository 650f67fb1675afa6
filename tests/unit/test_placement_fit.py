"""Memory fit counts reservations and foreign usage, not raw NVML free; MPS is required where asked;
live load breaks ties between GPUs the policy scores equal."""

from __future__ import annotations

import random

import pytest

from app.core.errors import ForeignUse, PlacementReason, ReasonKind, Shortfall
from app.core.model import Demand, Gpu, Node
from app.core.placement import Placement, place, registry
from app.core.placement.fit import (
    FOREIGN_MARGIN_MIB,
    FitFilter,
    fits_check,
    gpu_fits,
    memory_room,
    node_fits,
    node_misfit,
)

MIB = 40_960
POLICIES = ("binpack", "spread", "fgd", "fragaware")


def gpu(
    i: int, *, milli: int = 0, live_free: int | None = None, foreign: int = 0, util: int | None = None
) -> Gpu:
    return Gpu(
        index=i,
        model="A100-40GB",
        memory_mib=MIB,
        uuid=f"GPU-{i}",
        milli_used=milli,
        memory_used_mib=milli * MIB // 1000,
        live_free_mib=live_free,
        foreign_mib=foreign,
        utilization_percent=util,
    )


def test_a_whole_gpu_fits_an_idle_gpu_even_though_nvml_shows_driver_memory_used() -> None:
    idle = gpu(0, live_free=MIB - 500)
    assert gpu_fits(idle, Demand(count=1, milli=1000))
    node = Node("n", (idle, gpu(1, live_free=MIB - 500)))
    for name in POLICIES:
        got = place([node], Demand(count=2, milli=1000), registry.create(name))
        assert isinstance(got, Placement), name
        assert got.gpus == (0, 1)


def test_a_second_half_fits_when_the_first_half_uses_all_its_memory() -> None:
    # The first 0.5 pod really uses its 20 GiB: NVML free is 20 GiB, and that is not counted again.
    busy = gpu(0, milli=500, live_free=MIB // 2)
    assert gpu_fits(busy, Demand(count=1, milli=500))


def test_foreign_memory_and_its_margin_are_reserved() -> None:
    g = Gpu(0, "V100M16", 16_384, milli_used=500, memory_used_mib=8192, foreign_mib=7987)
    assert memory_room(g) == 16_384 - 8192 - 7987 - FOREIGN_MARGIN_MIB
    assert not gpu_fits(g, Demand(count=1, milli=500))
    assert gpu_fits(g, Demand(count=1, memory_mib=16_384 - 8192 - 7987 - FOREIGN_MARGIN_MIB))
    assert not gpu_fits(g, Demand(count=1, memory_mib=16_384 - 8192 - 7987 - FOREIGN_MARGIN_MIB + 1))


@pytest.mark.parametrize("name", POLICIES)
def test_mps_pods_skip_nodes_without_mps_with_a_reason(name: str) -> None:
    no_mps = Node("a", (gpu(0),), mps=False, mps_reason="MPS is disabled on this node")
    with_mps = Node("b", (gpu(0),))
    pol = registry.create(name)
    demand = Demand(count=1, milli=500, needs_mps=True)
    reason = pol.filter(no_mps, demand)
    assert reason is not None
    assert reason.rule == "pod asks for isolation=mps, but MPS is disabled on this node"
    got = place([no_mps, with_mps], demand, pol)
    assert isinstance(got, Placement)
    assert got.node.name == "b"
    # Without an explicit isolation=mps the node still takes the pod (co-location, best effort).
    assert pol.filter(no_mps, Demand(count=1, milli=500)) is None


@pytest.mark.parametrize("name", POLICIES)
def test_live_load_breaks_ties_between_equal_gpus(name: str) -> None:
    pol = registry.create(name)
    demand = Demand(count=1, milli=250)
    # Four empty GPUs: every policy scores them equal; the one least utilised wins, then most free.
    node = Node(
        "n",
        (
            gpu(0, util=80),
            gpu(1, util=10, live_free=1000),
            gpu(2, util=10, live_free=30_000),
            gpu(3, util=50),
        ),
    )
    got = place([node], demand, pol)
    assert isinstance(got, Placement)
    assert got.gpus == (2,)
    # With no live readings (the simulator) ties go to the lowest index.
    plain = Node("n", tuple(gpu(i) for i in range(4)))
    got = place([plain], demand, pol)
    assert isinstance(got, Placement)
    assert got.gpus == (0,)


@pytest.mark.parametrize("name", ("binpack", "fgd", "fragaware"))
def test_live_load_never_overrides_the_policy(name: str) -> None:
    # Packing policies put a 0.25 on the half-used GPU even if it is the busiest one.
    node = Node("n", (gpu(0, util=5), gpu(1, milli=500, util=95)))
    got = place([node], Demand(count=1, milli=250), registry.create(name))
    assert isinstance(got, Placement)
    assert got.gpus == (1,)


@pytest.mark.parametrize(
    ("node", "demand", "kind"),
    [
        pytest.param(
            Node("n", (gpu(0, milli=900),)), Demand(count=1, milli=500), ReasonKind.CAPACITY, id="share"
        ),
        pytest.param(
            Node("n", (gpu(0, foreign=40_000),)),
            Demand(count=1, memory_mib=4096),
            ReasonKind.CAPACITY,
            id="memory",
        ),
        pytest.param(
            Node("n", (gpu(0),), cpu_milli_free=100),
            Demand(count=1, milli=500, cpu_milli=200),
            ReasonKind.CAPACITY,
            id="cpu",
        ),
        pytest.param(
            Node("n", (gpu(0),)),
            Demand(count=1, milli=500, models=frozenset({"T4"})),
            ReasonKind.MODEL,
            id="model",
        ),
        pytest.param(
            Node(
                "n", (gpu(0),), schedulable=False, unschedulable_reason="gpupack agent heartbeat is 99s old"
            ),
            Demand(count=1, milli=500),
            ReasonKind.NODE,
            id="stale",
        ),
        pytest.param(
            Node("n", (gpu(0),), mps=False),
            Demand(count=1, milli=500, needs_mps=True),
            ReasonKind.NODE,
            id="no-mps",
        ),
        pytest.param(Node("n", ()), Demand(count=1, milli=500), ReasonKind.NODE, id="no-gpus"),
    ],
)
def test_every_refusal_carries_its_kind(node: Node, demand: Demand, kind: ReasonKind) -> None:
    reason = node_misfit(node, demand)
    assert reason is not None and reason.kind is kind, reason


@pytest.mark.parametrize(
    ("reason", "kind", "text"),
    [
        (PlacementReason("n", None, Shortfall.UNSCHEDULABLE), ReasonKind.NODE, "node is not schedulable"),
        (
            PlacementReason("n", None, Shortfall.CPU, 8000, 2000),
            ReasonKind.CAPACITY,
            "needs 8000 CPU milli: 2000 free",
        ),
        (
            PlacementReason("n", None, Shortfall.HOST_MEMORY, 4096, 1024),
            ReasonKind.CAPACITY,
            "needs 4096 MiB host memory: 1024 MiB free",
        ),
        (
            PlacementReason("n", None, Shortfall.NO_MPS),
            ReasonKind.NODE,
            "pod asks for isolation=mps, but no MPS daemon serves this node",
        ),
        (PlacementReason("n", None, Shortfall.NO_GPUS), ReasonKind.NODE, "node has no GPUs"),
        (PlacementReason("n", None, Shortfall.NO_HEALTHY_GPU), ReasonKind.NODE, "no healthy GPU"),
        (
            PlacementReason("n", None, Shortfall.MODEL, detail="T4", models=("A100", "V100M16")),
            ReasonKind.MODEL,
            "GPU model T4 is not one of A100|V100M16",
        ),
        (
            PlacementReason("n", None, Shortfall.GPU_SHARE, 805, -5),
            ReasonKind.CAPACITY,
            "no GPU with 0.805 free: best has 0.00",
        ),
        (
            PlacementReason("n", None, Shortfall.GPU_MEMORY, 8000, 7000, count=2, passing=1),
            ReasonKind.CAPACITY,
            "needs 2 GPUs with 8000 MiB free: 1 have it",
        ),
        (
            PlacementReason(
                "n", None, Shortfall.GPU_MEMORY, 8000, 6744, foreign=ForeignUse(1, 15109, 7000, 1109, 256)
            ),
            ReasonKind.CAPACITY,
            "no GPU with 8000 MiB free: best has 6744 MiB (gpu1: 15109 MiB total, 7000 MiB reserved by"
            " gpupack pods, 1109 MiB used by processes outside gpupack pods, 256 MiB margin)",
        ),
    ],
    ids=[
        "unschedulable",
        "cpu",
        "host-memory",
        "no-mps",
        "no-gpus",
        "unhealthy",
        "model",
        "share",
        "memory-multi",
        "memory-foreign",
    ],
)
def test_refusals_are_values_rendered_to_one_sentence(
    reason: PlacementReason, kind: ReasonKind, text: str
) -> None:
    assert reason.kind is kind
    assert reason.rule == text
    assert str(reason) == f"n: {text}"


def test_the_yes_no_fit_check_agrees_with_the_filter_on_random_nodes() -> None:
    rng = random.Random(7)
    models = ("A100-40GB", "V100")
    for _ in range(3000):
        gpus = tuple(
            Gpu(
                index=i,
                model=rng.choice(models),
                memory_mib=MIB,
                milli_used=rng.choice((0, 250, 500, 750, 1000)),
                memory_used_mib=rng.choice((0, MIB // 4, MIB // 2, MIB)),
                foreign_mib=rng.choice((0, 0, 300, 5000)),
                healthy=rng.random() > 0.1,
                mig_profile=rng.choice(("", "", "", "1g.10gb")),
            )
            for i in range(rng.randint(0, 4))
        )
        node = Node(
            "n",
            gpus,
            cpu_milli_free=rng.choice((None, 0, 4000)),
            memory_mib_free=rng.choice((None, 0, 8000)),
            schedulable=rng.random() > 0.1,
            mps=rng.random() > 0.2,
        )
        count = rng.randint(0, 3)
        demand = Demand(
            count=count,
            milli=rng.choice((None, 250, 500, 1000)) if count else None,
            models=frozenset(rng.sample(models, rng.randint(0, 1))),
            cpu_milli=rng.choice((0, 2000)),
            host_memory_mib=rng.choice((0, 4000)),
            needs_mps=rng.random() > 0.7,
        )
        if count and demand.milli is None:
            demand = Demand(count=count, memory_mib=rng.choice((1000, 20_000, 50_000)), models=demand.models)
        expected = node_misfit(node, demand) is None
        assert node_fits(node, demand) is expected, (node, demand)
        for name in POLICIES:
            assert fits_check(registry.create(name))(node, demand) is expected


def test_a_policy_with_its_own_filter_keeps_it_in_the_yes_no_check() -> None:
    class Picky(FitFilter):
        name = "picky"

        def filter(self, node: Node, demand: Demand) -> PlacementReason | None:
            return PlacementReason(node.name, None, Shortfall.UNSCHEDULABLE)

        def score(self, node: Node, demand: Demand) -> float:
            return 0.0

        def choose_gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
            return ()

    assert fits_check(Picky())(Node("n", (gpu(0),)), Demand(count=1, milli=500)) is False
