"""MIG devices as placement targets: whole-device requests, memory to the smallest device, refusals."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from app.core import catalog
from app.core.errors import ReasonKind, Shortfall
from app.core.model import Demand, Gpu, Node, mig_index
from app.core.placement import Placement, place, registry, to_allocation
from app.core.placement.fit import node_misfit

POLICIES = ("binpack", "spread", "fgd", "fragaware")
A100 = catalog.lookup("A100-80GB")
LAYOUT = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")


def mig_gpus(parent: int, layout: Sequence[str], used: Sequence[int] = ()) -> tuple[Gpu, ...]:
    """GPU `parent` partitioned into `layout`; slots in `used` are taken by a pod."""
    out = []
    for slot, name in enumerate(layout):
        profile = A100.mig_profile(name)
        assert profile is not None
        taken = slot in used
        out.append(
            Gpu(
                index=mig_index(parent, slot),
                model=A100.name,
                memory_mib=profile.memory_mib,
                uuid=f"MIG-{parent}-{slot}",
                milli_used=1000 if taken else 0,
                memory_used_mib=profile.memory_mib if taken else 0,
                mig_profile=name,
                parent=parent,
            )
        )
    return tuple(out)


def whole(index: int, milli_used: int = 0) -> Gpu:
    return Gpu(index, A100.name, A100.memory_mib, uuid=f"GPU-{index}", milli_used=milli_used)


def mixed(name: str = "n", used: Sequence[int] = ()) -> Node:
    """GPU 0 partitioned into LAYOUT, GPU 1 whole."""
    return Node(name, (whole(1), *mig_gpus(0, LAYOUT, used)))


def profile_demand(profile: str, count: int = 1) -> Demand:
    return Demand(count=count, mig=True, mig_profile=profile)


def memory_demand(mib: int) -> Demand:
    return Demand(count=1, memory_mib=mib, mig=True)


def chosen(nodes: Sequence[Node], demand: Demand, policy: str) -> Placement:
    result = place(nodes, demand, registry.create(policy))
    assert isinstance(result, Placement), result
    return result


@pytest.mark.parametrize("policy", POLICIES)
def test_a_profile_request_takes_a_whole_free_device_of_that_profile(policy: str) -> None:
    result = chosen([mixed(used=(2,))], profile_demand("1g.10gb"), policy)
    assert result.gpus == (mig_index(0, 3),)  # slot 2 is taken: the other 1g.10gb
    alloc = to_allocation(result.node, profile_demand("1g.10gb"), result.gpus)
    assert (alloc.gpu_uuids, alloc.milli, alloc.memory_mib) == (("MIG-0-3",), 1000, 9728)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    ("mib", "slot"),
    [(1, 2), (9728, 2), (9729, 1), (19968, 1), (20000, 0), (40192, 0)],
)
def test_a_memory_request_with_mig_isolation_takes_the_smallest_free_device_that_fits(
    policy: str, mib: int, slot: int
) -> None:
    assert chosen([mixed()], memory_demand(mib), policy).gpus == (mig_index(0, slot),)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_node_with_the_tightest_device_wins(policy: str) -> None:
    # node a has only a 3g.40gb free, node b a 2g.20gb: a 15000 MiB request wastes least on b.
    a = Node("a", mig_gpus(0, LAYOUT, used=(1, 2, 3)))
    b = Node("b", mig_gpus(0, LAYOUT, used=(0, 2, 3)))
    result = chosen([a, b], memory_demand(15000), policy)
    assert (result.node.name, result.gpus) == ("b", (mig_index(0, 1),))


@pytest.mark.parametrize("policy", POLICIES)
def test_shares_and_whole_gpu_requests_never_land_on_a_mig_device(policy: str) -> None:
    node = mixed()
    for demand in (Demand(count=1, milli=1000), Demand(count=1, milli=250), Demand(count=1, memory_mib=4096)):
        assert chosen([node], demand, policy).gpus == (1,)
    only_mig = Node("m", mig_gpus(0, LAYOUT))
    reasons = place([only_mig], Demand(count=1, milli=250), registry.create(policy))
    assert not isinstance(reasons, Placement)
    (reason,) = reasons
    assert reason.shortfall is Shortfall.ALL_MIG and reason.kind is ReasonKind.NODE
    assert "every GPU is partitioned into MIG devices" in reason.rule


@pytest.mark.parametrize("policy", POLICIES)
def test_mig_requests_never_land_on_a_whole_gpu(policy: str) -> None:
    node = Node("n", (whole(0), whole(1)))
    reason = node_misfit(node, memory_demand(4096))
    assert reason is not None and reason.rule == "no MIG device with 4096 MiB: node has no MIG devices"
    assert not isinstance(place([node], memory_demand(4096), registry.create(policy)), Placement)


def test_too_large_a_request_is_refused_naming_the_largest_free_device() -> None:
    node = mixed(used=(0,))  # the 3g.40gb is taken
    reason = node_misfit(node, memory_demand(30000))
    assert reason is not None
    assert (reason.shortfall, reason.kind, reason.free, reason.detail) == (
        Shortfall.MIG_DEVICE,
        ReasonKind.CAPACITY,
        19968,
        "2g.20gb",
    )
    assert reason.rule == "no free MIG device with 30000 MiB: the largest free is 2g.20gb (19968 MiB)"
    profile = node_misfit(node, profile_demand("3g.40gb"))
    assert profile is not None
    assert profile.rule == "no free MIG device of profile 3g.40gb: the largest free is 2g.20gb (19968 MiB)"
    full = node_misfit(mixed(used=(0, 1, 2, 3)), profile_demand("1g.10gb"))
    assert (
        full is not None
        and full.rule == "no free MIG device of profile 1g.10gb: all 4 MIG devices are in use"
    )
    two = node_misfit(node, profile_demand("1g.10gb", count=3))
    assert two is not None
    assert two.rule == (
        "needs 3 free MIG devices of profile 1g.10gb: 2 free: the largest free is 2g.20gb (19968 MiB)"
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_no_mig_device_is_handed_out_twice(policy: str) -> None:
    node = mixed()
    taken: list[int] = []
    for _ in range(4):
        result = chosen([node], memory_demand(1024), policy)
        taken += result.gpus
        node = node.reserve([to_allocation(node, memory_demand(1024), result.gpus)])
    assert sorted(taken) == [mig_index(0, s) for s in range(4)]
    assert [g.milli_free for g in node.gpus if g.is_mig] == [0, 0, 0, 0]
    assert not isinstance(place([node], memory_demand(1024), registry.create(policy)), Placement)
    # the whole GPU is still untouched and still takes shares
    assert node.gpu(1).milli_used == 0 and chosen([node], Demand(count=1, milli=500), policy).gpus == (1,)
