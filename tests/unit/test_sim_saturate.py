"""The FGD replay with repack: same arrivals in every mode, rescues carried out exactly as planned."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_sim import synthetic

from app.core.placement import registry
from bench.workloads.saturate import Mode, saturate


def test_on_failure_repack_places_pods_that_fit_nowhere_within_the_move_bound() -> None:
    nodes, pods, wl = synthetic()
    policy = registry.create("fragaware", wl)
    runs = {m: saturate(nodes, pods, policy, wl, seed=2, mode=m, inflate=1.1, max_moves=4) for m in Mode}
    # the same arrivals whatever the mode
    assert len({r.placed + r.failed for r in runs.values()}) == 1
    none, rescue = runs[Mode.NONE], runs[Mode.ON_FAILURE]
    assert none.evictions == none.rescued == 0
    # saturate raises AssertionError if a replacement lands off-plan or the pod still does not fit
    assert rescue.rescued >= 1
    assert rescue.rescued <= rescue.evictions <= 4 * rescue.rescued
    assert rescue.evictions_per_placed_pod == rescue.evictions / rescue.placed
    assert runs[Mode.PERIODIC].rescued == 0 < runs[Mode.PERIODIC].evictions
    for r in runs.values():
        assert 0.0 <= r.unallocated_pct_at_100 <= 100.0
        assert 0 <= r.could_move_at_first_failure <= r.running_at_first_failure
    # on-failure repack changes nothing before the first failure
    assert (none.running_at_first_failure, none.could_move_at_first_failure) == (
        rescue.running_at_first_failure,
        rescue.could_move_at_first_failure,
    )


def test_same_seed_same_run_and_no_moves_means_no_rescue() -> None:
    nodes, pods, wl = synthetic()
    policy = registry.create("binpack", wl)
    a = saturate(nodes, pods, policy, wl, seed=3, mode=Mode.ON_FAILURE, inflate=1.1)
    b = saturate(nodes, pods, policy, wl, seed=3, mode=Mode.ON_FAILURE, inflate=1.1)
    assert replace(a, seconds=0) == replace(b, seconds=0)
    zero = saturate(nodes, pods, policy, wl, seed=3, mode=Mode.ON_FAILURE, inflate=1.1, max_moves=0)
    assert zero.evictions == zero.rescued == 0
    plain = saturate(nodes, pods, policy, wl, seed=3, inflate=1.1)
    assert (zero.unallocated_pct_at_100, zero.placed) == (plain.unallocated_pct_at_100, plain.placed)


def test_arrivals_that_never_reach_capacity_are_refused() -> None:
    nodes, pods, wl = synthetic()
    with pytest.raises(ValueError, match="never reach 100 %"):
        saturate(nodes, pods, registry.create("binpack", wl), wl, seed=1, inflate=0.5)
