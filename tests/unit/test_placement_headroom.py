"""A node state's headroom answers share demands exactly as the node does: fit, spread and binpack scores,
and `within` (a node that only took pods offers no more, and spread scores it no higher)."""

from __future__ import annotations

import random

from app.core.model import Demand, Gpu, Node
from app.core.placement import registry, to_allocation
from app.core.placement.fit import HeadroomScore, headroom, headroom_fits, is_share, node_fits, within

MEMORY = (0, 15_109, 16_384, 32_510, 40_960)  # odd sizes make the floor in Demand.on bite


def random_node(rng: random.Random) -> Node:
    gpus = []
    for i in range(rng.randint(0, 8)):
        memory = rng.choice(MEMORY)
        milli = rng.choice((0, 0, 1, 110, 250, 460, 500, 999, 1000))
        gpus.append(
            Gpu(
                index=i,
                model=rng.choice(("G2", "T4")),
                memory_mib=memory,
                milli_used=milli,
                memory_used_mib=rng.choice((milli * memory // 1000, rng.randint(0, memory + 1))),
                foreign_mib=rng.choice((0, 0, 0, 300, 5000)),
                healthy=rng.random() > 0.1,
                mig_profile=rng.choice(("",) * 6 + ("1g.10gb",)),
            )
        )
    return Node(
        "n",
        tuple(gpus),
        cpu_milli_free=rng.choice((None, 0, 4000, 96_000)),
        memory_mib_free=rng.choice((None, 0, 8000, 393_216)),
        schedulable=rng.random() > 0.1,
        mps=rng.random() > 0.2,
    )


def random_share(rng: random.Random) -> Demand:
    count = rng.choice((0, 1, 1, 1, 2, 4, 8))
    return Demand(
        count=count,
        milli=rng.choice((0, 1, 50, 110, 250, 460, 500, 999, 1000)) if count else None,
        cpu_milli=rng.choice((0, 2000, 12_000)),
        host_memory_mib=rng.choice((0, 4000, 16_384)),
        needs_mps=rng.random() > 0.8,
    )


def test_headroom_fits_and_scores_share_demands_exactly_as_the_node() -> None:
    rng = random.Random(19)
    scorers = [p for p in (registry.create(n) for n in ("spread", "binpack")) if isinstance(p, HeadroomScore)]
    assert len(scorers) == 2
    fitted = 0
    for _ in range(20_000):
        node, demand = random_node(rng), random_share(rng)
        assert is_share(demand)
        room = headroom(node)
        fits = node_fits(node, demand)
        assert headroom_fits(room, demand) is fits, (node, demand)
        if fits:
            fitted += 1
            for policy in scorers:
                assert policy.score_headroom(room, demand) == policy.score(node, demand), (node, demand)
    assert fitted > 2000  # the check saw both answers often


def test_mig_and_model_demands_are_not_share_demands() -> None:
    assert not is_share(Demand(count=1, memory_mib=10_000, mig=True))
    assert not is_share(Demand(count=1, mig=True, mig_profile="1g.10gb"))
    assert not is_share(Demand(count=1, milli=500, models=frozenset({"T4"})))
    assert not is_share(Demand(count=1, memory_mib=8000))
    assert is_share(Demand(count=0)) and is_share(Demand(count=2, milli=1000))


def test_a_node_that_takes_a_pod_offers_no_more_and_spread_scores_it_no_higher() -> None:
    rng = random.Random(20)
    spread = registry.create("spread")
    assert isinstance(spread, HeadroomScore) and spread.score_falls_with_room
    took = 0
    for _ in range(5000):
        node, demand = random_node(rng), random_share(rng)
        if not node_fits(node, demand):
            continue
        gpus = spread.choose_gpus(node, demand)
        allocs = (to_allocation(node, demand, gpus),) if gpus else ()
        after = node.reserve(allocs).charge_host(demand.cpu_milli, demand.host_memory_mib)
        before_room, after_room = headroom(node), headroom(after)
        assert within(after_room, before_room)
        took += 1
        for _ in range(5):
            other = random_share(rng)
            if headroom_fits(after_room, other):
                assert headroom_fits(before_room, other)
                assert spread.score_headroom(after_room, other) <= spread.score_headroom(before_room, other)
        back = headroom(
            after.reserve(allocs, sign=-1).charge_host(-demand.cpu_milli, -demand.host_memory_mib)
        )
        assert back == before_room
        assert within(back, after_room) is (back == after_room)  # giving back is growth, unless a no-op
    assert took > 1000
