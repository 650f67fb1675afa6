"""The churn replay: departures, and repack rounds carried out exactly as the planner predicted."""

from __future__ import annotations

from test_sim import synthetic

from app.core.placement import registry
from bench.workloads.churn import churn


def test_repack_rounds_free_gpus_within_the_cap_and_land_as_planned() -> None:
    nodes, pods, wl = synthetic()
    policy = registry.create("fragaware", wl)
    # churn raises AssertionError if a replacement is placed anywhere but where the plan said
    r = churn(nodes, pods, policy, wl, seed=3, rounds=3, repack=True, max_evictions=10, depart=0.3)
    assert len(r.unallocated_pct) == 4
    assert all(0 <= e <= 10 for e in r.evictions)
    assert sum(r.gpus_freed) > 0
    assert all(0.0 <= u <= 100.0 for u in r.unallocated_pct)


def test_same_seed_same_run_and_repack_frees_whole_gpus_before_arrivals() -> None:
    nodes, pods, wl = synthetic()
    policy = registry.create("binpack", wl)
    a = churn(nodes, pods, policy, wl, seed=5, rounds=2, depart=0.3)
    b = churn(nodes, pods, policy, wl, seed=5, rounds=2, depart=0.3)
    assert (a.unallocated_pct, a.idle_gpus) == (b.unallocated_pct, b.idle_gpus)
    assert a.evictions == (0, 0) and a.gpus_freed == (0, 0)
    rp = churn(nodes, pods, policy, wl, seed=5, rounds=2, depart=0.3, repack=True)
    # the fill and the first departures are the same draws; repack adds the GPUs it emptied
    assert rp.unallocated_pct[0] == a.unallocated_pct[0]
    assert rp.idle_gpus[0] == a.idle_gpus[0] + rp.gpus_freed[0]
