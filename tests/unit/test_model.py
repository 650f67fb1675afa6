"""The cluster model: demand conversion, allocation <-> annotation round-trip, reservations."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from app.core import names
from app.core.isolation import MemoryEnforcement, Sharing
from app.core.model import Allocation, ClusterState, Demand, Gpu, Node


def test_fraction_reserves_floor_of_memory_so_shares_summing_to_one_fit() -> None:
    half = Demand(count=1, milli=500)
    assert half.on(15109) == (500, 7554)
    assert 2 * half.on(15109)[1] <= 15109


def test_memory_request_reserves_ceil_of_compute() -> None:
    assert Demand(count=1, memory_mib=4096).on(16384) == (250, 4096)
    assert Demand(count=1, memory_mib=5000).on(15109) == (331, 5000)


def test_memory_request_larger_than_gpu_cannot_fit_anywhere() -> None:
    milli, _ = Demand(count=1, memory_mib=40000).on(16384)
    assert milli > 1000


def test_cpu_only_demand_takes_nothing_from_a_gpu() -> None:
    assert Demand(count=0).on(16384) == (0, 0)


def _alloc() -> Allocation:
    return Allocation(node="n1", gpu_indexes=(1, 3), gpu_uuids=("GPU-a", "GPU-b"), milli=250, memory_mib=4000)


def test_allocation_round_trips_through_annotations() -> None:
    alloc = _alloc()
    ann = alloc.to_annotations()
    assert ann[names.ALLOC_GPU_INDEXES] == "1,3"
    assert ann[names.ALLOC_THREAD_PERCENTAGE] == "25"
    assert ann[names.ALLOC_MPS_MEMORY_LIMIT] == "0=4000M,1=4000M"
    assert Allocation.from_annotations(ann) == alloc


def test_allocation_without_uuids_round_trips() -> None:
    alloc = Allocation(node="n1", gpu_indexes=(0,), gpu_uuids=(), milli=1000, memory_mib=16000)
    assert Allocation.from_annotations(alloc.to_annotations()) == alloc


def test_a_burstable_allocation_records_its_hard_limit_and_mps_gets_the_cap() -> None:
    alloc = replace(_alloc(), hard_limit_mib=8000)
    ann = alloc.to_annotations()
    assert ann[names.ALLOC_MEMORY_LIMIT_MIB] == "4000"  # the reservation stays the request
    assert ann[names.ALLOC_MEMORY_HARD_LIMIT_MIB] == "8000"
    assert ann[names.ALLOC_MPS_MEMORY_LIMIT] == "0=8000M,1=8000M"  # the legacy pinned limit is the cap
    assert Allocation.from_annotations(ann) == alloc and alloc.cap_mib == 8000
    assert names.ALLOC_MEMORY_HARD_LIMIT_MIB not in _alloc().to_annotations() and _alloc().cap_mib == 4000
    with pytest.raises(ValueError, match=r"memory-hard-limit-mib='3999': must be an integer in \["):
        Allocation.from_annotations(ann | {names.ALLOC_MEMORY_HARD_LIMIT_MIB: "3999"})  # below the request


@pytest.mark.parametrize(
    ("demand", "gpus", "cap"),
    [
        pytest.param(Demand(count=1, memory_mib=4096, memory_limit_mib=8192), (15109,), 8192, id="memory"),
        pytest.param(
            Demand(count=1, memory_mib=4096, memory_limit_mib=20000), (15109,), 15109, id="gpu-caps-it"
        ),
        # A fraction's request grows with the GPU; the cap never drops below it (an unlisted bigger model).
        pytest.param(
            Demand(count=1, milli=500, memory_limit_mib=30000), (81920,), 40960, id="fraction-request"
        ),
        pytest.param(Demand(count=2, milli=250, memory_limit_mib=30000), (40960, 81920), 30000, id="least"),
        pytest.param(Demand(count=1, memory_mib=4096), (15109,), None, id="not-burstable"),
    ],
)
def test_the_hard_limit_on_the_gpus_chosen(demand: Demand, gpus: tuple[int, ...], cap: int | None) -> None:
    assert demand.hard_limit_on(gpus) == cap


def test_pod_without_allocation_has_none() -> None:
    assert Allocation.from_annotations({"other": "x"}) is None


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        pytest.param(
            names.ALLOC_GPU_INDEXES, "a,b", "must be a comma list of GPU indexes", id="index-not-number"
        ),
        pytest.param(names.ALLOC_GPU_INDEXES, "", "must be a comma list of GPU indexes", id="index-empty"),
        pytest.param(names.ALLOC_GPU_INDEXES, "1,1", "must not repeat a GPU index", id="index-repeated"),
        pytest.param(
            names.ALLOC_GPU_INDEXES, "１", "must be a comma list of GPU indexes", id="index-fullwidth"
        ),
        pytest.param(names.ALLOC_GPU_UUIDS, "GPU-a", "must list one UUID per index", id="uuid-count"),
        pytest.param(names.ALLOC_GPU_MILLI, "0", "must be an integer in [1, 1000]", id="milli-zero"),
        pytest.param(names.ALLOC_GPU_MILLI, "1001", "must be an integer in [1, 1000]", id="milli-too-big"),
        pytest.param(names.ALLOC_GPU_MILLI, "0.5", "must be an integer in [1, 1000]", id="milli-decimal"),
        pytest.param(names.ALLOC_MEMORY_LIMIT_MIB, "-1", "must be an integer in [0,", id="memory-negative"),
    ],
)
def test_corrupt_allocation_raises_value_error_naming_the_annotation(
    key: str, value: str, message: str
) -> None:
    ann = _alloc().to_annotations() | {key: value}
    with pytest.raises(ValueError) as err:
        Allocation.from_annotations(ann)
    assert f"{key}={value!r}: {message}" in str(err.value)


def _node() -> Node:
    return Node("n1", tuple(Gpu(index=i, model="T4", memory_mib=15109) for i in range(4)))


def test_cluster_state_apply_then_release_restores_the_node() -> None:
    state = ClusterState({"n1": _node()})
    alloc = _alloc()
    state.apply(alloc)
    used = {g.index: (g.milli_used, g.memory_used_mib) for g in state.nodes["n1"].gpus}
    assert used == {0: (0, 0), 1: (250, 4000), 2: (0, 0), 3: (250, 4000)}
    state.release(alloc)
    assert state.nodes["n1"] == _node()


def test_node_gpu_lookup_by_index() -> None:
    node = _node()
    assert node.gpu(2).index == 2
    assert node.milli_free_total == 4000
    with pytest.raises(KeyError, match="n1 has no GPU with index 9"):
        node.gpu(9)


def test_node_reserve_sums_allocations_per_gpu_and_releases_them() -> None:
    a = Allocation("n1", (0, 1), (), 300, 2000)
    b = Allocation("n1", (1,), (), 500, 6000)
    node = _node().reserve([a, b])
    used = {g.index: (g.milli_used, g.memory_used_mib) for g in node.gpus}
    assert used == {0: (300, 2000), 1: (800, 8000), 2: (0, 0), 3: (0, 0)}
    assert node.reserve([b], sign=-1).reserve([a], sign=-1) == _node()
    assert _node().reserve([]) == _node()


def test_node_charge_host_keeps_untracked_resources_untracked() -> None:
    tracked = Node("n1", (), cpu_milli_free=4000, memory_mib_free=8192)
    assert tracked.charge_host(1500, 1024) == Node("n1", (), cpu_milli_free=2500, memory_mib_free=7168)
    assert tracked.charge_host(1500, 1024).charge_host(-1500, -1024) == tracked
    assert _node().charge_host(1500, 1024) == _node()


def test_packing_efficiency_counts_only_gpus_in_use() -> None:
    state = ClusterState({"n1": _node()})
    assert state.packing_efficiency == 0.0
    state.apply(Allocation("n1", (0,), (), 1000, 15109))
    state.apply(Allocation("n1", (1,), (), 250, 3777))
    assert state.packing_efficiency == (1000 + 250) / 2000


def test_reserving_and_charging_keep_every_other_field() -> None:
    values: dict[str, object] = {
        "index": 3,
        "model": "T4",
        "memory_mib": 15_109,
        "uuid": "GPU-3",
        "milli_used": 100,
        "memory_used_mib": 1000,
        "foreign_mib": 7,
        "live_free_mib": 9000,
        "utilization_percent": 55,
        "healthy": False,
        "mig_profile": "1g.5gb",
        "parent": 0,
        "sharing": Sharing.EXCLUSIVE,
        "memory_enforcement": MemoryEnforcement.DAEMON_DEFAULT,
    }
    assert set(values) == {f.name for f in fields(Gpu)}  # a new field must be added here and to reserve
    gpu = Gpu(**values)  # type: ignore[arg-type]
    assert gpu.reserve(50, 200) == replace(gpu, milli_used=150, memory_used_mib=1200)
    node = Node("n", (gpu,), 8000, 4096, False, "cordoned", False, "no daemon")
    assert len(fields(Node)) == 8  # a new field must be added to Node._with
    alloc = Allocation("n", (3,), (), 50, 200)
    assert node.reserve((alloc,)) == replace(node, gpus=(gpu.reserve(50, 200),))
    assert node.charge_host(1000, 96) == replace(node, cpu_milli_free=7000, memory_mib_free=4000)
