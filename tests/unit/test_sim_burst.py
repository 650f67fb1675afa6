"""Burstable replays: requests below limits fit more pods on the same arrivals, at a measured exposure."""

from __future__ import annotations

import pytest
from test_sim import synthetic

from app.core.model import Demand, Gpu, Node
from app.core.placement import TargetWorkload, registry
from app.tools.sim.loader import TracePod
from bench.workloads.burst import burst, burstable


def one_gpu(*shares: int) -> tuple[tuple[Node, ...], tuple[TracePod, ...], TargetWorkload]:
    nodes = (Node("n", (Gpu(index=0, model="T4", memory_mib=15109),), 64_000, 256_000),)
    pods = tuple(TracePod(f"p{i}", Demand(count=1, milli=m)) for i, m in enumerate(shares))
    return nodes, pods, TargetWorkload.from_demands(p.demand for p in pods)


def test_a_request_is_the_ratio_of_the_share_rounded_up_and_whole_gpus_stay() -> None:
    assert burstable(Demand(count=1, milli=455), 0.5).milli == 228
    assert burstable(Demand(count=1, milli=400), 0.75).milli == 300
    assert burstable(Demand(count=2, milli=1000), 0.5).milli == 1000
    assert burstable(Demand(count=0), 0.5) == Demand(count=0)
    assert burstable(Demand(count=1, milli=455), 1.0).milli == 455


def test_three_pods_at_half_their_limit_share_one_gpu_and_its_exposure_is_counted() -> None:
    nodes, pods, wl = one_gpu(600, 600, 600)
    policy = registry.create("binpack", wl)
    # inflate 1.8: the three pods, nothing drawn again (a fourth would offer 2400 milli of limits)
    full = burst(nodes, pods, policy, wl, ratio=1.0, seed=1, inflate=1.8)
    half = burst(nodes, pods, policy, wl, ratio=0.5, seed=1, inflate=1.8)
    assert (full.arrived, full.placed, full.placed_shared) == (3, 1, 1)
    assert (full.overcommitted_gpus, full.exposed_pods, full.evictions_if_all_burst) == (0, 0, 0)
    assert (half.arrived, half.placed, half.placed_shared) == (3, 3, 3)
    assert (half.requested_pct, half.limits_pct) == (90.0, 180.0)
    assert half.host_cpu_pct == 0.0  # the pods ask no host CPU
    assert (half.overcommitted_gpus, half.overcommitted_pct, half.exposed_pct) == (1, 100.0, 100.0)
    assert half.over_soft_pct == 80.0  # 1800 milli of limits on a 1000-milli GPU
    assert half.evictions_if_all_burst == 2  # two 600s must go for the last one's limit to fit


def test_every_ratio_of_a_seed_sees_the_same_arrivals_and_smaller_requests_fit_no_fewer_pods() -> None:
    nodes, pods, wl = synthetic()
    policy = registry.create("fragaware", wl)
    runs = [burst(nodes, pods, policy, wl, ratio=r, seed=7) for r in (1.0, 0.75, 0.5)]
    assert len({r.arrived for r in runs}) == 1
    assert runs[0].overcommitted_gpus == 0 and runs[0].over_soft_pct == 0.0
    assert runs[0].placed_gpu <= runs[1].placed_gpu <= runs[2].placed_gpu
    with pytest.raises(ValueError, match="ratio=0: must be in"):
        burst(nodes, pods, policy, wl, ratio=0, seed=7)
