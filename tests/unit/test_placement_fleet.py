"""Mixed fleets: the part of a workload that lands on a model, scarce models, and where pods go on them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.core.model import Demand, Gpu, Node
from app.core.placement import Placement, place, registry
from app.core.placement.fragaware import GPUPACK_OPTIONS, FragAware
from app.core.placement.workload import PodShape, TargetWorkload

T4, G2 = frozenset({"T4"}), frozenset({"G2"})


def shapes(*pinned: tuple[float, frozenset[str]]) -> tuple[PodShape, ...]:
    """An unpinned 500-milli shape, a CPU-only one, and 1000-milli shapes pinned as given (sum 1)."""
    rest = 1.0 - 0.1 - sum(w for w, _ in pinned)
    return (
        PodShape(4000, 500, 1, frozenset(), rest),
        PodShape(2000, 0, 0, frozenset(), 0.1),
        *(PodShape(8000, 1000, 1, models, w) for w, models in pinned),
    )


def gpu_node(name: str, model: str, gpus: int, cpu: int = 64_000) -> Node:
    return Node(name, tuple(Gpu(i, model, 16_000) for i in range(gpus)), cpu_milli_free=cpu)


def test_landing_is_the_workload_itself_without_pins() -> None:
    wl = TargetWorkload(shapes())
    assert wl.landing("T4") is wl
    assert wl.settled_for("T4") is wl.settled_waste()


def test_landing_keeps_what_may_run_on_the_model_renormalised() -> None:
    wl = TargetWorkload(shapes((0.3, T4), (0.2, G2)))
    part = wl.landing("T4")
    assert part is not None and part is not wl
    assert [(s.milli, s.models) for s in part.shapes] == [(500, frozenset()), (0, frozenset()), (1000, T4)]
    assert [round(s.weight, 9) for s in part.shapes] == [round(x / 0.8, 9) for x in (0.4, 0.1, 0.3)]
    assert wl.landing("A100-40GB") is wl.landing("H100-80GB")  # one object for one part
    assert wl.cpu_per_milli_for("T4") == part.cpu_per_milli


def test_nothing_lands_where_every_gpu_shape_is_pinned_elsewhere() -> None:
    wl = TargetWorkload((PodShape(4000, 500, 1, G2, 1.0),))
    assert wl.landing("T4") is None
    assert wl.settled_for("T4")[190] == 190.0  # no pod comes to fill a hole
    assert wl.cpu_stranded(0, (1000,), "T4") == 0.0


def test_scarcity_is_the_narrower_pods_demand_over_the_models_gpus() -> None:
    # Per arriving pod: 0.6 x 500 + 0.3 x 1000 = 600 milli; 100 GPUs -> 166.7 pods arrive.
    wl = TargetWorkload(shapes((0.3, T4)), fleet=(("G2", 80), ("T4", 20)))
    # T4 pods bring 166.7 x 0.3 x 1000 = 50 000 milli for 20 000 on the T4s: the T4s are full.
    assert wl.scarcity("T4", frozenset()) == 1.0
    assert wl.scarcity("G2", frozenset()) == 0.0
    assert wl.scarcity("T4", T4) == 0.0  # a T4 pod competes with its peers, not with narrower pods
    roomy = TargetWorkload(shapes((0.03, T4)), fleet=(("G2", 80), ("T4", 20)))
    # 0.87 x 500 + 0.03 x 1000 = 465 milli per pod, 215 pods, 0.03 x 1000 each on 20 000 milli: 32.3 %.
    assert roomy.scarcity("T4", frozenset()) == pytest.approx(0.03 * 1000 / 20 * 100 / 465)


def test_scarcity_is_zero_without_a_fleet_and_a_set_shares_its_demand_by_gpus() -> None:
    assert TargetWorkload(shapes((0.3, T4))).scarcity("T4", frozenset()) == 0.0
    both = frozenset({"V100M16", "V100M32"})
    wl = TargetWorkload(shapes((0.1, both)), fleet=(("G2", 900), ("V100M16", 50), ("V100M32", 50)))
    # The set's demand spreads over its 100 GPUs: the same share of each member model.
    assert wl.scarcity("V100M16", frozenset()) == wl.scarcity("V100M32", frozenset()) > 0.0
    assert wl.scarcity("V100M16", both) == 0.0


def test_on_fleet_counts_gpus_per_model() -> None:
    nodes = [gpu_node("a", "T4", 2), gpu_node("b", "G2", 8), gpu_node("c", "T4", 4), Node("cpu", ())]
    assert TargetWorkload(shapes()).on_fleet(nodes).fleet == (("G2", 8), ("T4", 6))


def test_fleet_of_non_positive_gpus_is_refused_naming_the_model() -> None:
    with pytest.raises(ValueError, match=r"fleet\['T4'\]=0: must be a positive number of GPUs"):
        TargetWorkload(shapes(), fleet=(("T4", 0),))


def test_an_unpinned_pod_leaves_the_scarce_model_to_the_pods_pinned_there() -> None:
    # An empty T4 node, and a G2 node with one GPU taken and little CPU left: without the scarcity term
    # the CPU it would strand sends the pod to the T4 (one of 40 on the fleet, wanted by the T4 pods).
    wl = TargetWorkload(shapes((0.2, T4)), fleet=(("G2", 400), ("T4", 40)))
    taken = Gpu(0, "G2", 16_000, milli_used=1000, memory_used_mib=16_000)
    g2 = Node("g2", (taken, Gpu(1, "G2", 16_000)), cpu_milli_free=6000)
    nodes = [gpu_node("t4", "T4", 2), g2]
    unpinned, t4_pod = Demand(1, milli=500, cpu_milli=4000), Demand(1, milli=1000, models=T4, cpu_milli=8000)
    blind = FragAware(wl, options=replace(GPUPACK_OPTIONS, scarcity_weight=0.0))
    assert _node(place(nodes, unpinned, blind)) == "t4"
    assert _node(place(nodes, unpinned, registry.create("fragaware", wl))) == "g2"
    assert _node(place(nodes, t4_pod, registry.create("fragaware", wl))) == "t4"


def _node(placed: object) -> str:
    assert isinstance(placed, Placement)
    return placed.node.name
