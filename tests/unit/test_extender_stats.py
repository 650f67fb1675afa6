"""Cluster-state gauge math and the `gpupack top` rendering (pure)."""

from __future__ import annotations

from app.core.model import Allocation, ClusterState, Gpu, Node
from app.tools.top import bar, render
from extender.metrics import ExtenderStateCollector, PendingReason
from extender.stats import PendingReasons, gauges, typical_milli


def state(*used: tuple[int, ...]) -> ClusterState:
    nodes = {}
    for n, milli in enumerate(used):
        name = f"n{n}"
        gpus = tuple(
            Gpu(i, "A100", 40_000, milli_used=m, memory_used_mib=m * 40) for i, m in enumerate(milli)
        )
        nodes[name] = Node(name, gpus)
    return ClusterState(nodes)


def a(node: str, gpu: int, milli: int) -> Allocation:
    return Allocation(node, (gpu,), (), milli, milli * 40)


def test_packing_efficiency_fragmentation_and_free_gpus() -> None:
    st = state((1000, 500, 0), (300, 0, 0))
    allocs = {"1": a("n0", 0, 500), "2": a("n0", 0, 500), "3": a("n0", 1, 500), "4": a("n1", 0, 300)}
    g = gauges(st, allocs, [PendingReason.NO_FIT, PendingReason.NO_FIT, PendingReason.WAITING], leader=True)
    assert g.packing_efficiency == (1000 + 500 + 300) / 3000
    assert g.typical_milli == 500
    assert g.fragmented_milli == 0  # 500 free on gpu1 fits a typical 500; 700 free on n1/gpu0 too
    assert g.gpus_free == 3
    assert g.pending == {"no_fit": 2, "waiting": 1}
    assert [(x.node, x.gpu, x.pods) for x in g.gpus if x.pods] == [("n0", 0, 2), ("n0", 1, 1), ("n1", 0, 1)]


def test_fragmentation_counts_free_share_too_small_for_the_typical_request() -> None:
    st = state((800, 900, 1000))
    allocs = {str(i): a("n0", 0, 800) for i in range(3)}
    g = gauges(st, allocs, [], leader=False)
    assert g.typical_milli == 800
    assert g.fragmented_milli == 200 + 100


def test_typical_is_the_mode_smallest_on_ties() -> None:
    assert typical_milli([]) == 0
    assert typical_milli([a("n", 0, 300), a("n", 0, 500)]) == 300


def test_top_renders_bars_and_totals() -> None:
    out = render(state((500, 0)), {("n0", 0): ["ns/a", "ns/b"]})
    lines = out.splitlines()
    assert lines[1].startswith("n0")
    assert "[##########----------]" in lines[1] and lines[1].endswith(" 2")
    assert "2 GPUs: 0.50 allocated, 1 in use, 1 free; packing efficiency 50.0%" in out
    assert bar(1200) == "[####################]!"


def test_the_engine_remembers_verdicts_per_node_state_and_never_reuses_a_changed_node() -> None:
    from dataclasses import replace

    from app.core.model import Demand
    from app.core.placement import registry
    from app.core.placement.engine import Engine

    calls: list[str] = []
    inner = registry.create("binpack")

    class Counting:
        name = inner.name

        def filter(self, node: Node, demand: Demand) -> object:
            calls.append("filter")
            return inner.filter(node, demand)

        def score(self, node: Node, demand: Demand) -> float:
            calls.append("score")
            return inner.score(node, demand)

        def choose_gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
            return inner.choose_gpus(node, demand)

    engine = Engine(Counting())  # type: ignore[arg-type]
    node = state((600, 0)).nodes["n0"]
    d = Demand(count=1, milli=500)
    for _ in range(2):
        v = engine.verdict(node, d)
        assert v.fits and v.score == inner.score(node, d)
    assert calls == ["filter", "score"]
    full = replace(node, gpus=tuple(replace(g, milli_used=1000) for g in node.gpus))
    reason = engine.verdict(full, d).reason
    assert reason is not None and reason.rule == "no GPU with 0.50 free: best has 0.00"
    assert calls == ["filter", "score", "filter"]


def mig_state() -> ClusterState:
    """n0: GPU 1 whole at 500 milli; GPU 0 as MIG devices 100 (3g.40gb, held) and 101 (1g.10gb, free)."""
    gpus = (
        Gpu(1, "A100-80GB", 81920, milli_used=500, memory_used_mib=40960),
        Gpu(100, "A100-80GB", 40192, milli_used=1000, memory_used_mib=40192, mig_profile="3g.40gb", parent=0),
        Gpu(101, "A100-80GB", 9728, mig_profile="1g.10gb", parent=0),
    )
    return ClusterState({"n0": Node("n0", gpus)})


def test_mig_devices_have_their_own_gauge_and_stay_out_of_free_gpus() -> None:
    allocs = {"1": a("n0", 1, 500), "2": Allocation("n0", (100,), ("MIG-a",), 1000, 40192)}
    g = gauges(mig_state(), allocs, [], leader=True)
    assert g.gpus_free == 0  # the whole GPU is in use; a free MIG device is no free GPU
    assert [(x.gpu, x.mig_profile, x.parent, x.milli, x.pods) for x in g.gpus] == [
        (1, "", None, 500, 1),
        (100, "3g.40gb", 0, 1000, 1),
        (101, "1g.10gb", 0, 0, 0),
    ]
    families = {f.name: f for f in ExtenderStateCollector(lambda: g).collect()}
    samples = [(s.labels, s.value) for s in families["gpupack_extender_mig_device_allocated"].samples]
    assert samples == [
        ({"node": "n0", "gpu": "0", "mig": "100", "profile": "3g.40gb"}, 1),
        ({"node": "n0", "gpu": "0", "mig": "101", "profile": "1g.10gb"}, 0),
    ]


def test_top_shows_mig_devices_as_parent_slot_with_their_profile() -> None:
    out = render(mig_state(), {("n0", 100): ["ns/big"]}, typical=500)
    lines = out.splitlines()
    assert lines[4].endswith(
        "n0: 0.50 of 1 GPUs allocated, 0 free, fragmented 0.00; 1 of 2 MIG devices in use"
    )
    assert lines[2].split()[:4] == ["n0", "0/0", "A100-80GB", "3g.40gb"] and lines[2].endswith(" 1")
    assert lines[3].split()[:4] == ["n0", "0/1", "A100-80GB", "1g.10gb"]
    assert "1 GPUs: 0.50 allocated, 1 in use, 0 free; packing efficiency 50.0%" in out  # MIG devices left out
    assert out.endswith("2 MIG devices: 1 in use, 1 free")


def test_pending_reasons_count_each_pending_pod_once_and_forget_the_rest() -> None:
    reasons = PendingReasons()
    reasons.note("a", PendingReason.NO_FIT)
    reasons.note("b", PendingReason.MODEL)
    reasons.note("a", PendingReason.UNSCHEDULABLE)  # the last refusal wins
    reasons.note("gone", PendingReason.NO_FIT)
    reasons.clear("b")  # a later filter passed it
    assert reasons.of(["a", "b", "c"]) == [
        PendingReason.UNSCHEDULABLE,
        PendingReason.WAITING,
        PendingReason.WAITING,
    ]
    # A pod no longer pending at a scrape (bound, deleted) is forgotten: refused again later, it counts anew.
    assert reasons.get("gone") is None
    assert reasons.of(["gone"]) == [PendingReason.WAITING]
