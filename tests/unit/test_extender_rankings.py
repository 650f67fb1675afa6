"""The extender's incremental rankings answer filter and prioritize exactly as place() over cache.nodes().

A random cluster changes under the rankings step by step (pods bound and deleted, holds taken and
released, heartbeats, unhealthy GPUs, nodes added and removed, host allocatable, a heartbeat going
stale); after every step each policy's fast answer is compared with the literal one: every node judged
by the policy, the decision made by `place`, the priorities by `score_nodes` + `normalize_scores`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from app.core.errors import PlacementReason
from app.core.explain import NO_GPUNODE, reason_text
from app.core.model import Demand, Node
from app.core.placement import (
    Placement,
    Policy,
    normalize_scores,
    place,
    registry,
    score_nodes,
    to_allocation,
)
from app.kube.cache import ClusterCache
from extender import verbs
from extender.rankings import Rankings
from extender.verbs import PENDING_REASON, FilterOutcome
from tests.unit.test_kube_cache import NOW, cache, gpunode, pod

POLICIES = ("binpack", "spread", "fgd", "fragaware")
SHAPES = (
    Demand(count=1, milli=250, cpu_milli=500),
    Demand(count=1, milli=500),
    Demand(count=2, milli=700),
    Demand(count=1, memory_mib=4096),
    Demand(count=1, milli=1000, cpu_milli=8000),
)

MOVES = ("bind", "bind", "delete", "hold", "release", "beat", "unhealthy", "stale", "grow", "shrink", "host")


def literal_filter(
    nodes: Mapping[str, Node | None], demand: Demand, policy: Policy, decide: bool
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Filter as the definition says: each node judged by the policy, the decision made by place()."""
    passed: list[Node] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    for name, node in nodes.items():
        if node is None:
            unresolvable[name] = NO_GPUNODE
            continue
        reason = policy.filter(node, demand)
        if reason is None:
            passed.append(node)
        else:
            fails = PENDING_REASON[reason.kind] is verbs.PendingReason.NO_FIT
            (failed if fails else unresolvable)[name] = reason_text(reason)
    if decide and passed:
        # The decision alone: kube-scheduler reads the other nodes' statuses only when none passes.
        chosen = place(passed, demand, policy)
        assert isinstance(chosen, Placement)
        return [chosen.node.name], {}, {}
    return [n.name for n in passed], failed, unresolvable


class World:
    """A cluster cache with a random history, and the moves that change it."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.clock = [NOW]
        self.cache: ClusterCache = cache(now=self.clock)
        self.nodes = [f"n{i}" for i in range(12)]
        self.gpus = {n: rng.choice((1, 2, 4, 8)) for n in self.nodes}
        self.beats = dict.fromkeys(self.nodes, NOW)
        self.cache.set_gpunodes([self.gpunode(n) for n in self.nodes])
        self.cache.set_nodes([self.node_obj(n) for n in self.nodes[::2]])
        self.pods: dict[str, dict[str, Any]] = {}
        self.serial = 0
        self.cache.set_pods([])
        for _ in range(30):
            self.bind_random()

    def gpunode(self, name: str, unhealthy: int | None = None) -> dict[str, Any]:
        obj = gpunode(name, gpus=self.gpus[name], beat=self.beats[name])
        if unhealthy is not None:
            obj["status"]["gpus"][unhealthy]["healthy"] = False
        return obj

    def node_obj(self, name: str) -> dict[str, Any]:
        cpu = self.rng.choice(("4", "16", "64"))
        alloc = {"cpu": cpu, "memory": "256Gi"}
        return {"metadata": {"name": name}, "status": {"allocatable": alloc}}

    def bind_random(self) -> None:
        name = self.rng.choice(self.nodes)
        node = self.cache.node(name)
        if node is None or not node.gpus:
            return
        g = self.rng.randrange(len(node.gpus))
        milli = self.rng.choice((100, 250, 500))
        if node.gpus[g].milli_free < milli:
            return
        self.bind(name, Demand(count=1, milli=milli), (node.gpus[g].index,))

    def bind(self, name: str, demand: Demand, gpus: tuple[int, ...]) -> None:
        node = self.cache.node(name)
        assert node is not None and demand.milli is not None
        self.serial += 1
        uid = f"u{self.serial}"
        obj = pod(f"p{self.serial}", uid, milli=demand.milli, count=demand.count, node=name, phase="Running")
        obj["metadata"]["annotations"].update(to_allocation(node, demand, gpus).to_annotations())
        obj["metadata"]["labels"] = {"gpupack.io/managed": "true"}
        self.pods[uid] = obj
        self.cache.upsert_pod(obj)

    def step(self) -> str:
        """One random change to the cluster; returns what it was."""
        rng = self.rng
        move = rng.choice(
            (
                "bind",
                "bind",
                "delete",
                "hold",
                "release",
                "beat",
                "unhealthy",
                "stale",
                "grow",
                "shrink",
                "host",
            )
        )
        if move == "bind":
            self.bind_random()
        elif move == "delete" and self.pods:
            uid = rng.choice(sorted(self.pods))
            self.cache.delete_pod(self.pods.pop(uid))
        elif move == "hold":
            name = rng.choice(self.nodes)
            node = self.cache.node(name)
            if node is not None and node.gpus and node.gpus[0].milli_free >= 200:
                self.serial += 1
                self.cache.assume.hold(
                    f"held{self.serial}", to_allocation(node, Demand(count=1, milli=200), (0,))
                )
        elif move == "release" and self.cache.assume.items():
            self.cache.assume.release(rng.choice(sorted(self.cache.assume.items())))
        elif move == "beat":
            name = rng.choice(self.nodes)
            self.beats[name] = self.clock[0]
            self.cache.upsert_gpunode(self.gpunode(name))
        elif move == "unhealthy":
            name = rng.choice(self.nodes)
            self.cache.upsert_gpunode(self.gpunode(name, unhealthy=0))
        elif move == "stale":
            self.clock[0] += rng.choice((0.5, 30.0, 89.5, 95.0))
        elif move == "grow":
            name = f"n{len(self.nodes) + self.serial}"
            self.serial += 1
            self.nodes.append(name)
            self.gpus[name] = rng.choice((1, 4, 8))
            self.beats[name] = self.clock[0]
            self.cache.upsert_gpunode(self.gpunode(name))
        elif move == "shrink" and len(self.nodes) > 3:
            name = self.nodes.pop(rng.randrange(len(self.nodes)))
            self.cache.delete_gpunode({"metadata": {"name": name}})
        elif move == "host":
            self.cache.upsert_node(self.node_obj(rng.choice(self.nodes)))
        return move

    def names(self) -> list[str]:
        """What kube-scheduler sends: usually every node, sometimes a subset, now and then an unknown one."""
        rng = self.rng
        every = list(self.nodes)
        rng.shuffle(every)
        pick = rng.random()
        if pick < 0.5:
            return every
        subset = every[: rng.randint(1, len(every))]
        return [*subset, "no-such-node"] if pick > 0.9 else subset


def answers_agree(world: World, rankings: Rankings, policy: Policy, demand: Demand, uid: str) -> None:
    names = world.names()
    nodes = world.cache.nodes(names, exclude_uid=uid)
    for decide in (True, False):
        with rankings.standings(demand, exclude_uid=uid) as standings:
            fast = verbs.filter_nodes(names, standings, decide)
        passed, failed, unresolvable = literal_filter(nodes, demand, policy, decide)
        assert (fast.passed, fast.failed, fast.unresolvable) == (passed, failed, unresolvable)
        assert fast.refusal is None if passed else fast.refusal is not None
    chosen = place([n for n in nodes.values() if n is not None], demand, policy)
    with rankings.standings(demand, exclude_uid=uid) as standings:
        best = verbs.filter_nodes(names, standings, True)
        scores = verbs.prioritize(names, standings)
    assert best.passed == ([chosen.node.name] if isinstance(chosen, Placement) else [])
    raw: dict[str, float | None] = dict.fromkeys(names)
    raw.update(score_nodes([n for n in nodes.values() if n is not None], demand, policy))
    expected = normalize_scores(raw)
    assert scores == [(n, expected[n]) for n in names]


@pytest.mark.parametrize("name", POLICIES)
def test_rankings_decide_exactly_like_place_as_the_cluster_changes(name: str) -> None:
    rng = random.Random(f"rankings-{name}")
    world = World(rng)
    policy = registry.create(name)
    rankings = Rankings(world.cache, policy, max_shapes=3)  # fewer than the shapes: tables start over too
    moves: set[str] = set()
    for _ in range(150):
        moves.add(world.step())
        demand = rng.choice(SHAPES)
        uid = rng.choice(["", "u1", *sorted(world.cache.assume.items())[:1], *sorted(world.pods)[-1:]])
        answers_agree(world, rankings, policy, demand, uid)
        # Half the time the pod is bound where the policy put it, as after a real bind.
        if rng.random() < 0.5 and demand.milli is not None:
            with rankings.standings(demand) as standings:
                out = verbs.filter_nodes(world.nodes, standings, True)
            if out.passed:
                node = world.cache.node(out.passed[0])
                assert node is not None
                world.bind(out.passed[0], demand, policy.choose_gpus(node, demand))
    assert moves >= {"bind", "delete", "hold", "beat", "unhealthy", "stale", "grow", "shrink", "host"}


def test_a_refused_pod_gets_the_most_actionable_reason_class() -> None:
    world = World(random.Random(3))
    policy = registry.create("binpack")
    rankings = Rankings(world.cache, policy)
    huge = Demand(count=16, milli=1000)  # no node has 16 GPUs: capacity on every node
    with rankings.standings(huge) as standings:
        out: FilterOutcome = verbs.filter_nodes(["n0", "gone"], standings, True)
    assert out.passed == [] and out.refusal is verbs.PendingReason.NO_FIT
    assert out.unresolvable == {"gone": NO_GPUNODE} and set(out.failed) == {"n0"}


@pytest.mark.parametrize("name", POLICIES)
def test_decide_finds_place_choice_when_the_best_nodes_are_not_offered(name: str) -> None:
    """kube-scheduler may leave out the ranking's best nodes (its own filters): the choice is then
    place()'s among the nodes offered, however many of the best are missing (past verbs.SCANS too)."""
    world = World(random.Random(f"offered-{name}"))
    policy = registry.create(name)
    rankings = Rankings(world.cache, policy)
    demand = Demand(count=1, milli=100)
    offered = list(world.nodes)
    chosen: list[str] = []
    while offered:
        nodes = world.cache.nodes(offered)
        expected = place([n for n in nodes.values() if n is not None], demand, policy)
        with rankings.standings(demand) as standings:
            out = verbs.filter_nodes(offered, standings, True)
        assert out.passed == ([expected.node.name] if isinstance(expected, Placement) else [])
        if not out.passed:
            break
        chosen.append(out.passed[0])
        offered.remove(out.passed[0])  # the next request leaves the best node out
    assert len(chosen) > verbs.SCANS + 1  # the later requests missed more than SCANS best nodes


def test_names_answers_membership_by_scan_then_by_set() -> None:
    names = verbs.Names(["a", "b", "c"])
    asked = ["a", "x", "c", "y", "b", "z", "a"]  # more lookups than SCANS: the set answers the rest
    assert [n in names for n in asked] == [True, False, True, False, True, False, True]
    assert sorted(names) == ["a", "b", "c"] and len(names) == 3


class Counting:
    """A policy that counts the nodes it judges."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.judged: list[str] = []

    def filter(self, node: Node, demand: Demand) -> PlacementReason | None:
        self.judged.append(node.name)
        return self.inner.filter(node, demand)

    def score(self, node: Node, demand: Demand) -> float:
        return self.inner.score(node, demand)

    def choose_gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
        return self.inner.choose_gpus(node, demand)


def test_only_changed_nodes_are_judged_again() -> None:
    world = World(random.Random(5))
    policy = Counting(registry.create("fragaware"))
    rankings = Rankings(world.cache, policy)
    demand = Demand(count=1, milli=250)
    with rankings.standings(demand) as standings:
        first = verbs.filter_nodes(world.nodes, standings, True)
    assert sorted(policy.judged) == sorted(world.nodes)  # a new shape: every node once
    policy.judged.clear()
    with rankings.standings(demand) as standings:
        assert verbs.filter_nodes(world.nodes, standings, True) == first
    assert policy.judged == []  # nothing changed: nothing judged
    node = world.cache.node(first.passed[0])
    assert node is not None
    world.bind(first.passed[0], demand, policy.choose_gpus(node, demand))
    world.beats["n1"] = world.clock[0]
    world.cache.upsert_gpunode(world.gpunode("n1"))  # a heartbeat alone changes no view
    with rankings.standings(demand) as standings:
        verbs.filter_nodes(world.nodes, standings, True)
    assert policy.judged == [first.passed[0]]
    policy.judged.clear()
    world.gpus["n99"] = 2
    world.beats["n99"] = world.clock[0]
    world.nodes.append("n99")
    world.cache.upsert_gpunode(world.gpunode("n99"))  # the order moves; the other views stay
    with rankings.standings(demand) as standings:
        verbs.filter_nodes(world.nodes, standings, True)
    assert policy.judged == ["n99"]


def test_prepared_rankings_answer_as_unprepared_ones_as_the_cluster_changes() -> None:
    """prepare() (at Ready) reads every node ahead of the first request; nodes that change afterwards are
    read again, so the answers are those of rankings that read nothing ahead."""
    rng = random.Random("prepare")
    world = World(rng)
    policy = registry.create("fragaware")
    prepared, plain = Rankings(world.cache, policy), Rankings(world.cache, policy)
    prepared.prepare()
    for _ in range(40):
        world.step()
        demand = rng.choice(SHAPES)
        answers = []
        for rankings in (prepared, plain):
            with rankings.standings(demand) as standings:
                out = verbs.filter_nodes(world.nodes, standings, False)
                answers.append((out, verbs.prioritize(out.passed, standings)))
        assert answers[0] == answers[1]
