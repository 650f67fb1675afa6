"""Making room for a pod that fits nowhere: the fewest moves, protected pods never moved, refusals."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from test_repack_plan import QUARTER, empty_nodes, fragmented, layout, replay

from app.core.model import Demand, Node
from app.core.placement import Placement, place, registry
from app.tools.repack.plan import Goal, Plan, PodRef
from app.tools.repack.room import Room, make_room

WHOLE = Demand(1, milli=1000)
HALF = Demand(1, milli=500)


def fits_after(nodes: list[Node], pods: Sequence[PodRef], room: Room, demand: Demand, policy: str) -> None:
    """Carry the moves out as the cluster would, then the pod must go exactly where the room says."""
    after = replay(nodes, pods, room.plan.moves, policy)
    order = [n.name for n in nodes]
    got = place(sorted(after, key=lambda n: order.index(n.name)), demand, registry.create(policy))
    assert isinstance(got, Placement)
    assert (got.node.name, got.gpus) == (room.node, room.gpus)


def blocks(nodes: Sequence[Node], demand: Demand, policy: str) -> None:
    assert not isinstance(place(nodes, demand, registry.create(policy)), Placement), "it fits already"


@pytest.mark.parametrize("policy", ["binpack", "fragaware"])
def test_a_whole_gpu_pod_fits_once_one_quarter_moves(policy: str) -> None:
    nodes, pods = fragmented(2, 2)  # each of 4 GPUs holds one 0.25 pod
    blocks(nodes, WHOLE, policy)
    room = make_room(nodes, pods, {}, registry.create(policy), WHOLE)
    assert room is not None
    assert room.plan.evictions == 1
    assert room.plan.goal is Goal.ROOM
    (move,) = room.plan.moves
    assert (move.source.node, move.source.gpu_indexes) == (room.node, room.gpus)
    fits_after(nodes, pods, room, WHOLE, policy)


def test_a_pod_that_fits_now_needs_no_moves() -> None:
    nodes, pods = fragmented(2, 2)
    room = make_room(nodes, pods, {}, registry.create("binpack"), HALF)
    assert room is not None and room.plan.moves == ()


def test_the_fewest_moves_win_over_a_cheaper_share() -> None:
    # node-0/gpu0: three 0.25 pods (two must go for 0.75); node-0/gpu1: a 0.5 and a 0.25 (the 0.5 alone
    # will do); node-1 (bare pods, fuller): room for the 0.5 on gpu0 only.
    nodes, pods = layout(
        empty_nodes(2, 2),
        [(0, 0, QUARTER)] * 3
        + [(0, 1, HALF), (0, 1, QUARTER)]
        + [(1, 0, Demand(1, milli=500, cpu_milli=16_000)), (1, 1, Demand(1, milli=800, cpu_milli=16_000))],
    )
    pods = [p if p.alloc.node == "node-0" else PodRef(p.key, p.uid, p.alloc, p.demand, "bare") for p in pods]
    need = Demand(1, milli=750)
    blocks(nodes, need, "binpack")
    room = make_room(nodes, pods, {}, registry.create("binpack"), need)
    assert room is not None
    assert [m.pod for m in room.plan.moves] == ["ns/p3"]  # the half, not two quarters
    assert (room.node, room.gpus) == ("node-0", (1,))
    fits_after(nodes, pods, room, need, "binpack")


def test_max_moves_bounds_the_plan() -> None:
    # one node: gpu0 is half used by a bare pod, gpu1 holds two 0.25 pods; a whole-GPU pod needs both moved
    nodes, pods = layout(empty_nodes(1, 2), [(0, 0, HALF), (0, 1, QUARTER), (0, 1, QUARTER)])
    pods = [PodRef(pods[0].key, pods[0].uid, pods[0].alloc, pods[0].demand, "bare"), *pods[1:]]
    policy = registry.create("binpack")
    assert make_room(nodes, pods, {}, policy, WHOLE, max_moves=1) is None
    room = make_room(nodes, pods, {}, policy, WHOLE, max_moves=2)
    assert room is not None and room.plan.evictions == 2
    assert {m.target.gpu_indexes for m in room.plan.moves} == {(0,)}
    assert (room.node, room.gpus) == ("node-0", (1,))
    fits_after(nodes, pods, room, WHOLE, "binpack")


@pytest.mark.parametrize(
    ("blocked", "pdbs", "budgets"),
    [
        ("bare pod: no controller would re-create it", (), {}),
        ('opted out (gpupack.io/movable: "false")', (), {}),
        ("", ("ns/web",), {"ns/web": 0}),
        ("", ("ns/web",), {}),  # a PDB without status yet allows nothing
    ],
)
def test_protected_pods_are_never_moved(blocked: str, pdbs: tuple[str, ...], budgets: dict[str, int]) -> None:
    nodes, pods = fragmented(2, 2)
    pods = [PodRef(p.key, p.uid, p.alloc, p.demand, blocked, pdbs) for p in pods]
    assert make_room(nodes, pods, budgets, registry.create("binpack"), WHOLE) is None
    # one movable pod among them is the one that moves
    pods[3] = PodRef(pods[3].key, pods[3].uid, pods[3].alloc, pods[3].demand)
    room = make_room(nodes, pods, budgets, registry.create("binpack"), WHOLE)
    assert room is not None
    assert [m.uid for m in room.plan.moves] == ["uid-3"]
    assert {k for k, _ in room.plan.kept} == {"ns/p0", "ns/p1", "ns/p2"}


def test_refused_when_the_moved_pod_has_nowhere_else_to_go() -> None:
    nodes, pods = layout(empty_nodes(1, 1), [(0, 0, QUARTER)])
    assert make_room(nodes, pods, {}, registry.create("binpack"), WHOLE) is None
    # and when every other GPU is full
    nodes, pods = layout(empty_nodes(1, 2), [(0, 0, QUARTER), (0, 1, Demand(1, milli=900))])
    assert make_room(nodes, pods, {}, registry.create("fragaware"), WHOLE) is None


def test_a_two_gpu_pod_gets_the_two_gpus_cheapest_to_clear() -> None:
    # gpu0 and gpu1 hold one quarter each, gpu2 two quarters, gpu3 three: clear gpu0 and gpu1 (2 moves)
    nodes, pods = layout(
        empty_nodes(1, 4), [(0, 0, QUARTER), (0, 1, QUARTER)] + [(0, 2, QUARTER)] * 2 + [(0, 3, QUARTER)] * 1
    )
    two = Demand(2, milli=1000)
    blocks(nodes, two, "binpack")
    room = make_room(nodes, pods, {}, registry.create("binpack"), two)
    assert room is not None and room.plan.evictions == 2
    assert set(room.gpus) == {0, 1}
    assert all(m.target.gpu_indexes[0] in {2, 3} for m in room.plan.moves)
    fits_after(nodes, pods, room, two, "binpack")


def test_the_room_is_made_only_on_nodes_the_pod_may_use() -> None:
    nodes, pods = fragmented(2, 2)
    room = make_room(nodes, pods, {}, registry.create("binpack"), WHOLE, allowed=frozenset({"node-1"}))
    assert room is not None and room.node == "node-1"
    assert room.plan.moves[0].target.node == "node-0"
    assert make_room(nodes, pods, {}, registry.create("binpack"), WHOLE, allowed=frozenset()) is None


def test_a_room_plan_survives_its_json_form() -> None:
    nodes, pods = fragmented(2, 2)
    room = make_room(nodes, pods, {}, registry.create("fragaware"), WHOLE)
    assert room is not None
    assert Plan.from_dict(room.plan.to_dict()) == room.plan
    assert room.plan.to_dict()["goal"] == "room"


def test_the_room_table_says_where_the_pod_goes() -> None:
    from app.tools.repack.command import render_room

    nodes, pods = fragmented(2, 2)
    pods[0] = PodRef(pods[0].key, pods[0].uid, pods[0].alloc, pods[0].demand, "bare pod")
    room = make_room(nodes, pods, {}, registry.create("binpack"), WHOLE)
    assert room is not None
    lines = render_room("ns/big", room).splitlines()
    assert lines[0].split() == ["POD", "FROM", "TO", "GPUS", "FREED"]
    (move,) = room.plan.moves
    assert lines[1].split()[:2] == [move.pod, f"{move.source.node}/gpu{move.source.gpu_indexes[0]}"]
    assert lines[3] == f"1 evictions make room for ns/big on {room.node}/gpu{room.gpus[0]} (policy binpack)"
    assert lines[4:] == ["kept in place: 1 pods", "  ns/p0: bare pod"]


def test_repack_for_refuses_a_pod_it_cannot_make_room_for_naming_the_flag() -> None:
    from test_kube_cache import pod

    from app.core import names
    from app.kube.snapshot import Snapshot
    from app.tools.repack.command import compute_room

    bound = pod("bound", "uid-b", node="node-0")
    pending = pod("waiting", "uid-w")
    broken = pod("broken", "uid-x")
    broken["metadata"]["annotations"][names.GPU_FRACTION] = "1.5"
    snap = Snapshot(pods=[bound, pending, broken])
    kw: dict[str, object] = {"policy": "binpack", "max_moves": 4, "namespace": None}
    cases = {
        "ns/missing": "--for='ns/missing': must name a gpupack pod (label gpupack.io/managed)",
        "ns/bound": "--for='ns/bound': must be a Pending pod, not yet bound (bound to node-0)",
        "ns/broken": "--for='ns/broken': must have a valid GPU request (",
        "ns/waiting": "--for='ns/waiting': must fit after 4 moves or fewer of movable pods; none make room",
    }
    for key, message in cases.items():
        with pytest.raises(ValueError) as err:
            compute_room(snap, snap.cache(), key, **kw)  # type: ignore[arg-type]
        assert str(err.value).startswith(message), str(err.value)
