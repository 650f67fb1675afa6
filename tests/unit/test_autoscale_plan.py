"""Scale-up sizing: the GPUs pending pods need, packed by the placement engine the extender runs."""

from __future__ import annotations

import pytest

from app.core.autoscale.plan import Coming, PendingPod, Pool, plan
from app.core.model import Allocation, Demand, Gpu, Node
from app.core.placement import registry

A100 = "A100-80GB"
H100 = "H100-80GB"


def share(key: str, milli: int, count: int = 1, models: frozenset[str] = frozenset()) -> PendingPod:
    return PendingPod(key, Demand(count=count, milli=milli, models=models))


def full_node(name: str, model: str = A100, gpus: int = 8) -> Node:
    node = Pool(model, gpus).empty_node(name)
    allocs = [Allocation(name, (i,), (), 1000, node.gpus[i].memory_mib) for i in range(gpus)]
    return node.reserve(allocs)


@pytest.fixture(params=["binpack", "fragaware"])
def policy(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return registry.create(request.param)


def test_five_030_shares_ask_for_two_gpus(policy) -> None:  # type: ignore[no-untyped-def]
    pending = [share(f"ns/p{i}", 300) for i in range(5)]
    got = plan([full_node("n0")], pending, [Pool(A100, 8)], policy)
    assert got.gpus == 2
    assert [(r.pool.model, r.gpus) for r in got.requests] == [(A100, 2)]
    assert set(got.requests[0].pods) == {p.key for p in pending}
    assert got.fit_now == () and got.unplaceable == ()


def test_spread_asks_for_the_gpus_it_would_spread_over() -> None:
    """Same engine as the extender: under `spread` five shares land on five GPUs, so five are asked for."""
    got = plan(
        [full_node("n0")],
        [share(f"ns/p{i}", 300) for i in range(5)],
        [Pool(A100, 8)],
        registry.create("spread"),
    )
    assert got.gpus == 5


def test_room_on_existing_nodes_is_used_first(policy) -> None:  # type: ignore[no-untyped-def]
    half = Pool(A100, 2).empty_node("n1").reserve([Allocation("n1", (0,), (), 500, 40960)])
    got = plan(
        [full_node("n0"), half],
        [share("ns/a", 500), share("ns/b", 1000), share("ns/c", 700)],
        [Pool(A100, 8)],
        policy,
    )
    assert set(got.fit_now) == {"ns/a", "ns/b"}  # GPU 0's other half and the idle GPU 1
    assert got.gpus == 1 and got.requests[0].pods == ("ns/c",)


def test_more_gpus_than_a_node_has_make_several_requests(policy) -> None:  # type: ignore[no-untyped-def]
    pending = [share(f"ns/w{i}", 1000) for i in range(11)]
    got = plan([], pending, [Pool(A100, 8)], policy)
    assert sorted(r.gpus for r in got.requests) == [3, 8]
    assert got.gpus == 11


def test_multi_gpu_pod_is_asked_for_on_one_node(policy) -> None:  # type: ignore[no-untyped-def]
    pending = [share("ns/a", 1000, count=6), share("ns/b", 1000, count=6)]
    got = plan([], pending, [Pool(A100, 8)], policy)
    assert sorted(r.gpus for r in got.requests) == [6, 6]  # never 8 + 4: b cannot be split over nodes


def test_model_choice_picks_the_pool_the_pod_accepts(policy) -> None:  # type: ignore[no-untyped-def]
    pools = [Pool(A100, 8), Pool(H100, 8)]
    got = plan([], [share("ns/h", 500, models=frozenset({H100})), share("ns/any", 500)], pools, policy)
    assert sorted((r.pool.model, r.gpus) for r in got.requests) == [(A100, 1), (H100, 1)]


def test_a_pod_no_pool_can_hold_is_reported_not_requested(policy) -> None:  # type: ignore[no-untyped-def]
    got = plan(
        [],
        [share("ns/big", 1000, count=16), share("ns/v100", 500, models=frozenset({"V100-16GB"}))],
        [Pool(A100, 8)],
        policy,
    )
    assert got.requests == ()
    assert [u.key for u in got.unplaceable] == ["ns/big", "ns/v100"]
    assert "16 GPU(s)" in got.unplaceable[0].why and "A100-80GB:8" in got.unplaceable[0].why


def test_memory_requests_are_sized_on_the_pool_model(policy) -> None:  # type: ignore[no-untyped-def]
    # 30 GiB on an 80 GiB A100: two fit one GPU, a third does not.
    pending = [PendingPod(f"ns/m{i}", Demand(count=1, memory_mib=30 * 1024)) for i in range(3)]
    assert plan([], pending, [Pool(A100, 8)], policy).gpus == 2


def test_no_gpu_over_committed_in_the_imagined_nodes(policy) -> None:  # type: ignore[no-untyped-def]
    shares = [250, 500, 700, 300, 1000, 100, 900, 450, 550, 650] * 4
    pending = [share(f"ns/p{i}", m) for i, m in enumerate(shares)]
    got = plan([full_node("n0")], pending, [Pool(A100, 8)], policy)
    lower_bound = -(-sum(shares) // 1000)
    assert lower_bound <= got.gpus <= lower_bound + 2
    assert sum(len(r.pods) for r in got.requests) == len(pending)


def test_unhealthy_or_unschedulable_nodes_offer_no_room(policy) -> None:  # type: ignore[no-untyped-def]
    idle = Pool(A100, 8).empty_node("n0")
    cordoned = Node(idle.name, idle.gpus, schedulable=False, unschedulable_reason="draining")
    assert plan([cordoned], [share("ns/a", 500)], [Pool(A100, 8)], policy).gpus == 1
    sick = Node("n1", tuple(Gpu(g.index, g.model, g.memory_mib, healthy=False) for g in idle.gpus))
    assert plan([sick], [share("ns/a", 500)], [Pool(A100, 8)], policy).gpus == 1


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        ("A100-80GB", "must be MODEL:GPUS"),
        ("A100-80GB:0", "from 1 to 64"),
        ("A100-80GB:x", "must be MODEL:GPUS"),
        (":8", "must be MODEL:GPUS"),
        ("Z9000:8", "Z9000"),
    ],
)
def test_pool_parse_names_value_and_rule(raw: str, rule: str) -> None:
    with pytest.raises(ValueError, match=rule) as exc:
        Pool.parse(raw)
    assert repr(raw) in str(exc.value)


def test_pool_parse_canonical_model() -> None:
    assert Pool.parse("A100-80GB:8") == Pool(A100, 8)


def test_a_node_on_its_way_takes_pending_pods_before_another_is_imagined(policy) -> None:  # type: ignore[no-untyped-def]
    pending = [share(f"ns/w{i}", 1000) for i in range(13)]
    on_its_way = Coming("placeholder-a", Pool(A100, 8))
    got = plan([full_node("n0")], pending, [Pool(A100, 8)], policy, coming=(on_its_way,))
    assert got.awaited == ("placeholder-a",)
    assert [(r.pool.model, r.gpus) for r in got.requests] == [(A100, 5)]  # 8 on the way, 5 more
    assert len(got.requests[0].pods) == 5
    nothing_more = plan([full_node("n0")], pending[:6], [Pool(A100, 8)], policy, coming=(on_its_way,))
    assert nothing_more.requests == () and nothing_more.awaited == ("placeholder-a",)
    unused = plan([Pool(A100, 8).empty_node("n1")], pending[:2], [Pool(A100, 8)], policy, (on_its_way,))
    assert unused.awaited == () and unused.requests == () and set(unused.fit_now) == {"ns/w0", "ns/w1"}
