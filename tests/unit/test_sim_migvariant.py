"""The MIG variant of a trace: partitioning, share → MIG memory requests, physical GPUs used."""

from __future__ import annotations

import random

import pytest

from app.core import catalog
from app.core.model import Demand, Gpu, Node
from app.core.placement import Placement, place, registry, to_allocation
from app.core.placement.workload import default_workload
from app.tools.sim.engine import replay
from bench.workloads.migvariant import as_mig, as_whole, partition, physical_gpus_used

A100 = catalog.lookup("A100-80GB")
LAYOUT = tuple(p for name in ("3g.40gb", "3g.40gb") if (p := A100.mig_profile(name)) is not None)


def node(name: str, gpus: int = 4) -> Node:
    return Node(name, tuple(Gpu(i, A100.name, A100.memory_mib) for i in range(gpus)))


def test_partition_replaces_the_first_gpus_by_their_mig_devices() -> None:
    n = partition(node("n"), LAYOUT, gpus=1)
    assert [(g.index, g.mig_profile, g.parent, g.memory_mib) for g in n.gpus] == [
        (1, "", None, 81920),
        (2, "", None, 81920),
        (3, "", None, 81920),
        (100, "3g.40gb", 0, 40192),
        (101, "3g.40gb", 0, 40192),
    ]


def test_shares_become_mig_memory_requests_unless_no_device_holds_them() -> None:
    assert as_mig(Demand(1, milli=470), A100, 40192) == Demand(1, memory_mib=38503, mig=True)
    assert as_mig(Demand(1, milli=810), A100, 40192) == Demand(1, milli=1000)  # 66356 MiB: a whole GPU
    assert as_mig(Demand(2, milli=1000), A100, 40192) == Demand(2, milli=1000)
    assert as_mig(Demand(0, cpu_milli=4000), A100, 40192) == Demand(0, cpu_milli=4000)
    assert as_whole(Demand(1, memory_mib=4096)) == Demand(1, milli=1000)


def test_two_halves_use_one_partitioned_gpu_where_whole_gpus_take_two() -> None:
    nodes = [partition(node("n"), LAYOUT, gpus=2)]
    demands = [as_mig(Demand(1, milli=470), A100, 40192) for _ in range(2)] + [Demand(1, milli=1000)]
    placed, after = replay(nodes, demands, registry.create("fragaware"), default_workload())
    assert None not in placed
    assert physical_gpus_used(after) == 2  # one partitioned GPU (both 3g.40gb) + one whole GPU
    whole = [as_whole(d) for d in demands]
    placed, after = replay([node("n")], whole, registry.create("fragaware"), default_workload())
    assert None not in placed and physical_gpus_used(after) == 3


@pytest.mark.parametrize("policy", ["binpack", "spread", "fgd", "fragaware"])
def test_fast_path_places_a_mig_mix_exactly_like_place(policy: str) -> None:
    """The simulator's indexed chooser and `place` over every node agree on MIG and whole-GPU demands."""
    layout = tuple(
        p for name in ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb") if (p := A100.mig_profile(name))
    )
    nodes = [partition(node(f"n{i}"), layout, gpus=i % 3) for i in range(6)]
    rng = random.Random(7)
    shapes = [Demand(1, milli=1000), Demand(1, milli=470), Demand(2, milli=1000), Demand(1, milli=110)]
    demands = [as_mig(rng.choice(shapes), A100, 40192) for _ in range(60)]
    demands += [Demand(1, mig=True, mig_profile="1g.10gb")] * 5
    wl = default_workload()
    fast, _ = replay(nodes, demands, registry.create(policy, wl), wl)
    slow: list[tuple[int, tuple[int, ...]] | None] = []
    current = list(nodes)
    slow_policy = registry.create(policy, wl)
    for d in demands:
        result = place(current, d, slow_policy)
        if not isinstance(result, Placement):
            slow.append(None)
            continue
        i = current.index(result.node)
        slow.append((i, result.gpus))
        current[i] = result.node.reserve([to_allocation(result.node, d, result.gpus)])
    assert fast == slow
    assert any(w is not None and w[1][0] >= 100 for w in fast)  # MIG devices were handed out
    assert None in fast  # and the cluster ran out of something
