"""The repack planner: PDBs counted, pinned pods never moved, every move placed by the extender's code."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from app.core.model import MILLI_PER_GPU, Allocation, Demand, Gpu, Node
from app.core.placement import Placement, place, registry, to_allocation
from app.tools.repack.plan import Goal, Move, Plan, PodRef, plan, with_share

MODEL = "A100-40GB"
QUARTER = Demand(1, milli=250, cpu_milli=1000, host_memory_mib=1024)


def empty_nodes(count: int, gpus: int) -> list[Node]:
    return [
        Node(
            f"node-{k}",
            tuple(Gpu(i, MODEL, 40960, uuid=f"GPU-{k}-{i}") for i in range(gpus)),
            cpu_milli_free=64_000,
            memory_mib_free=256_000,
        )
        for k in range(count)
    ]


def layout(
    nodes: list[Node], shares: Sequence[tuple[int, int, Demand]], **ref: object
) -> tuple[list[Node], list[PodRef]]:
    """Pods at (node position, GPU index) with a demand; returns the nodes with their shares applied."""
    pods = []
    for n, (k, i, d) in enumerate(shares):
        a = to_allocation(nodes[k], d, (i,))
        nodes[k] = with_share(nodes[k], a, d, +1)
        pods.append(PodRef(f"ns/p{n}", f"uid-{n}", a, d, **ref))  # type: ignore[arg-type]
    return nodes, pods


def fragmented(count: int = 2, gpus: int = 4) -> tuple[list[Node], list[PodRef]]:
    """Every GPU holds one 0.25 pod of a Deployment."""
    return layout(empty_nodes(count, gpus), [(k, i, QUARTER) for k in range(count) for i in range(gpus)])


def replay(nodes: list[Node], pods: Sequence[PodRef], moves: Sequence[Move], policy: str) -> list[Node]:
    """Carry out the moves as the cluster would: evict, let `place` choose; it must agree with the plan."""
    pol = registry.create(policy)
    by_uid = {p.uid: p for p in pods}
    state = {n.name: n for n in nodes}
    for m in moves:
        pod = by_uid[m.uid]
        assert pod.blocked == ""
        state[m.source.node] = with_share(state[m.source.node], m.source, pod.demand, -1)
        allowed = [n for n in state.values() if pod.nodes is None or n.name in pod.nodes]
        got = place(allowed, pod.demand, pol)
        assert isinstance(got, Placement), m.pod
        assert (got.node.name, got.gpus) == (m.target.node, m.target.gpu_indexes), m.pod
        target = state[m.target.node]
        for i in m.target.gpu_indexes:
            g = target.gpu(i)
            assert pod.demand.on(g.memory_mib)[0] <= g.milli_free, f"{m.pod} does not fit gpu{i}"
        state[m.target.node] = with_share(target, m.target, pod.demand, +1)
    for node in state.values():
        assert all(0 <= g.milli_used <= MILLI_PER_GPU for g in node.gpus)
    return list(state.values())


def idle(nodes: Sequence[Node]) -> int:
    return sum(g.milli_used == 0 for n in nodes for g in n.gpus)


@pytest.mark.parametrize("policy", ["binpack", "fragaware"])
def test_eight_quarter_gpus_are_packed_onto_two_freeing_six(policy: str) -> None:
    nodes, pods = fragmented()
    got = plan(nodes, pods, {}, registry.create(policy))
    assert len(got.freed_gpus) == 6
    assert got.evictions == 6
    after = replay(nodes, pods, got.moves, policy)
    assert idle(after) == 6
    assert {(n.name, g.index) for n in after for g in n.gpus if g.milli_used == 0} == set(got.freed_gpus)
    # each drained GPU is announced once, on the move that empties it
    assert sorted(r for m in got.moves for r in m.frees) == sorted(got.freed_gpus)


def test_goal_nodes_empties_a_whole_node() -> None:
    nodes, pods = fragmented()
    got = plan(nodes, pods, {}, registry.create("binpack"), goal=Goal.NODES)
    assert got.freed_nodes == ("node-1",)
    assert got.evictions == 4  # node-1's four pods, nothing on node-0 moves
    assert {m.source.node for m in got.moves} == {"node-1"}
    replay(nodes, pods, got.moves, "binpack")


def test_bare_and_opted_out_pods_never_move() -> None:
    nodes, pods = fragmented()
    pinned = {"uid-7": "bare pod: no controller would re-create it", "uid-6": "opted out"}
    pods = [PodRef(p.key, p.uid, p.alloc, p.demand, blocked=pinned.get(p.uid, "")) for p in pods]
    got = plan(nodes, pods, {}, registry.create("binpack"))
    assert not {m.uid for m in got.moves} & set(pinned)
    assert dict(got.kept) == {"ns/p7": pinned["uid-7"], "ns/p6": pinned["uid-6"]}
    # nothing is moved onto the GPUs they hold either (a replacement there would free nothing)
    assert all(
        (m.target.node, m.target.gpu_indexes[0]) not in {("node-1", 2), ("node-1", 3)} for m in got.moves
    )
    after = replay(nodes, pods, got.moves, "binpack")
    assert len(got.freed_gpus) == idle(after) >= 4


def test_a_budget_that_allows_no_disruption_keeps_its_pods() -> None:
    nodes, pods = fragmented()
    pods = [
        PodRef(p.key, p.uid, p.alloc, p.demand, pdbs=("ns/db",) if p.alloc.node == "node-0" else ())
        for p in pods
    ]
    got = plan(nodes, pods, {"ns/db": 0}, registry.create("binpack"))
    assert not any(m.source.node == "node-0" for m in got.moves)
    assert ("ns/p0", "PodDisruptionBudget ns/db allows 0 disruptions now") in got.kept
    # node-1's quarters join node-0's (a GPU holding a protected pod can still take a replacement)
    assert got.freed_gpus == tuple(("node-1", i) for i in range(4))
    replay(nodes, pods, got.moves, "binpack")


def test_max_unavailable_one_moves_one_pod_at_a_time_and_every_move_names_its_budget() -> None:
    nodes, pods = fragmented()
    pods = [PodRef(p.key, p.uid, p.alloc, p.demand, pdbs=("ns/web",)) for p in pods]
    got = plan(nodes, pods, {"ns/web": 1}, registry.create("binpack"))
    assert got.evictions == 6
    assert all(m.pdbs == ("ns/web",) for m in got.moves)
    # a PDB that is missing from the budgets (no status yet) counts as allowing nothing
    assert plan(nodes, pods, {}, registry.create("binpack")).evictions == 0


def test_max_evictions_caps_the_plan_without_a_half_drained_gpu() -> None:
    nodes, pods = fragmented()
    got = plan(nodes, pods, {}, registry.create("binpack"), max_evictions=4)
    assert got.evictions == 4
    assert len(got.freed_gpus) == 4
    # two pods per GPU: a cap of 3 drains one GPU (2 evictions), never a third pod of the next one
    nodes2, pods2 = layout(
        empty_nodes(1, 4), [(0, i, Demand(1, milli=125)) for i in range(4) for _ in range(2)]
    )
    got2 = plan(nodes2, pods2, {}, registry.create("binpack"), max_evictions=3)
    assert got2.evictions == 2 and len(got2.freed_gpus) == 1


def test_whole_gpu_pods_free_nothing_and_stay() -> None:
    whole = Demand(1, milli=1000)
    nodes, pods = layout(empty_nodes(1, 4), [(0, 0, whole), (0, 1, whole)])
    got = plan(nodes, pods, {}, registry.create("binpack"))
    assert got.moves == () and got.freed_gpus == ()


def test_a_pod_confined_to_its_node_is_not_moved_elsewhere() -> None:
    nodes, pods = fragmented()
    pods = [
        PodRef(
            p.key, p.uid, p.alloc, p.demand, nodes=frozenset({"node-1"}) if p.alloc.node == "node-1" else None
        )
        for p in pods
    ]
    got = plan(nodes, pods, {}, registry.create("binpack"))
    for m in got.moves:
        if m.source.node == "node-1":
            assert m.target.node == "node-1"
    replay(nodes, pods, got.moves, "binpack")
    # node-1's pods pack onto node-1/gpu0. A replacement from node-0 would go to node-0 while its pod is
    # still terminating, to the fuller node-1 once it is gone: timing decides, so they stay.
    assert got.freed_gpus == tuple(("node-1", i) for i in range(1, 4))


def test_a_move_whose_landing_depends_on_timing_is_not_planned() -> None:
    # Two half pods on node-0/gpu0 and gpu1, each alone: while one is still terminating the other GPU
    # and its own look the same to best fit, so the replacement could go back where it came from.
    half = Demand(1, milli=500)
    nodes, pods = layout(empty_nodes(1, 2), [(0, 0, half), (0, 1, half)])
    got = plan(nodes, pods, {}, registry.create("binpack"))
    after = replay(nodes, pods, got.moves, "binpack")
    assert idle(after) == len(got.freed_gpus) == 1


def test_plan_survives_its_json_form() -> None:
    nodes, pods = fragmented()
    got = plan(nodes, pods, {"ns/web": 1}, registry.create("fragaware"))
    again = Plan.from_dict(got.to_dict())
    assert again == got
    assert got.to_dict()["gpusFreed"] == 6


def test_move_json_without_allocations_is_refused() -> None:
    a = Allocation("n", (0,), ("u",), 250, 10240)
    raw = Move("ns/p", "u1", a, a).to_dict()
    raw["to"] = {}
    with pytest.raises(ValueError, match="'from' and 'to' must be allocations"):
        Move.from_dict(raw)
