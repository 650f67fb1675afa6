"""A node a repack is emptying carries the draining taint for exactly as long as the run."""

from __future__ import annotations

from app.core.errors import KubeError
from app.kube.calls import JsonDict, Request
from app.tools.repack import drain
from app.tools.repack.plan import Goal, Move, Plan
from tests.unit.test_repack_apply import DST, SRC, FakeKube, executor


class NodeKube(FakeKube):
    """FakeKube plus Nodes: GET, and merge patches of the taint list with a resourceVersion precondition.

    Each node starts with a foreign taint that must survive; `gone` nodes answer 404; `races` conflicts
    (409) the first write of that many patches, as a concurrent writer would.
    """

    def __init__(
        self, *args: object, gone: frozenset[str] = frozenset(), races: int = 0, **kw: object
    ) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.nodes: dict[str, dict[str, object]] = {}
        self.tainted_during_eviction: dict[str, set[str]] = {}
        self.gone = gone
        self.races = races

    def node(self, name: str) -> dict[str, object]:
        return self.nodes.setdefault(name, {"rv": 1, "taints": [{"key": "other", "effect": "NoExecute"}]})

    def keys(self, name: str) -> set[str]:
        return {t["key"] for t in self.node(name)["taints"]}  # type: ignore[attr-defined]

    def send(self, req: Request) -> JsonDict:
        if req.path.startswith("/api/v1/nodes/"):
            name = req.path.rsplit("/", 1)[1]
            if name in self.gone:
                raise KubeError(404, "NotFound", f'nodes "{name}" not found')
            node = self.node(name)
            if req.method == "GET":
                return {
                    "metadata": {"name": name, "resourceVersion": str(node["rv"])},
                    "spec": {"taints": node["taints"]},
                }
            assert req.method == "PATCH" and req.content_type == "application/merge-patch+json"
            if self.races:
                self.races -= 1
                node["rv"] = int(node["rv"]) + 1  # type: ignore[call-overload]
            if req.body["metadata"]["resourceVersion"] != str(node["rv"]):
                raise KubeError(409, "Conflict", "the object has been modified")
            node["taints"] = req.body["spec"]["taints"] or []
            node["rv"] = int(node["rv"]) + 1  # type: ignore[call-overload]
            return {}
        if req.path.endswith("/eviction"):
            self.tainted_during_eviction = {n: self.keys(n) for n in self.nodes}
        return super().send(req)


def nodes_plan() -> Plan:
    move = Move("ns/web-a", "u1", SRC, DST, pdbs=("ns/web",), frees=(("n1", 3),))
    return Plan(Goal.NODES, "binpack", (move,), (("n1", 3),), ("n1",), ())


def test_emptied_nodes_are_tainted_while_pods_move_and_untainted_after() -> None:
    kube = NodeKube(lands=DST, races=1)
    report = executor(kube).run(nodes_plan())
    assert report.stopped is None
    assert kube.tainted_during_eviction == {"n1": {"other", drain.TAINT_KEY}}
    assert kube.keys("n1") == {"other"}  # a foreign taint survives both writes


def test_the_taint_goes_even_when_the_run_stops() -> None:
    kube = NodeKube(lands=DST, refuse=True)
    report = executor(kube).run(nodes_plan())
    assert report.stopped is not None
    assert kube.keys("n1") == {"other"}


def test_a_node_the_autoscaler_removed_meanwhile_is_no_error() -> None:
    kube = NodeKube(lands=DST, gone=frozenset({"n1"}))
    kube.gone = frozenset()
    runner = executor(kube)
    original = kube.send

    def send(req: Request) -> JsonDict:
        if req.path.endswith("/eviction"):
            kube.gone = frozenset({"n1"})  # removed once empty, before the run untaints it
        return original(req)

    kube.send = send  # type: ignore[method-assign]
    assert runner.run(nodes_plan()).stopped is None


def test_gpus_goal_and_dry_run_taint_nothing() -> None:
    for plan, dry in (
        (Plan(Goal.GPUS, "binpack", nodes_plan().moves, (("n1", 3),), ("n1",), ()), False),
        (nodes_plan(), True),
    ):
        kube = NodeKube(lands=DST)
        executor(kube).run(plan, dry_run=dry)
        assert kube.nodes == {}


def test_a_tainted_node_is_no_target_unless_the_pod_tolerates_it() -> None:
    from app.tools.repack.selectors import scheduler_refusal

    node = {"metadata": {"name": "n1", "labels": {}}, "spec": {"taints": [drain.taint()]}}
    assert drain.change(node, draining=True) is None  # already there: no write
    assert scheduler_refusal({}, node) == f"tainted {drain.TAINT_KEY}:NoSchedule, not tolerated by the pod"
    exists = {"tolerations": [{"key": drain.TAINT_KEY, "operator": "Exists"}]}
    equal = {"tolerations": [{"key": drain.TAINT_KEY, "value": "repack", "effect": "NoSchedule"}]}
    other = {"tolerations": [{"key": drain.TAINT_KEY, "value": "other"}]}
    everything = {"tolerations": [{"operator": "Exists"}]}
    assert [scheduler_refusal(s, node) is None for s in (exists, equal, other, everything)] == [
        True,
        True,
        False,
        True,
    ]
    prefer = {"metadata": {"name": "n2"}, "spec": {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}}
    assert scheduler_refusal({}, prefer) is None


def test_the_node_being_emptied_is_no_target_for_its_own_pods() -> None:
    """n1's 0.75 share would best go back into the hole it leaves; the taint keeps it out, so n1 empties."""
    from app.core.model import Allocation, Demand, Gpu, Node
    from app.core.placement import registry
    from app.tools.repack.plan import PodRef, plan

    shares = {"n0": [(0, 750)], "n1": [(0, 750), (1, 500)], "n2": [(0, 500), (1, 300), (1, 300)]}
    nodes, pods = [], []
    for name, placed in shares.items():
        allocs = [Allocation(name, (g,), (), m, m * 81920 // 1000) for g, m in placed]
        nodes.append(Node(name, tuple(Gpu(i, "A100-80GB", 81920) for i in range(2))).reserve(allocs))
        pods += [
            PodRef(f"ns/{name}-{i}", f"{name}-{i}", a, Demand(1, milli=a.milli)) for i, a in enumerate(allocs)
        ]
    got = plan(nodes, pods, {}, registry.create("fragaware"), goal=Goal.NODES)
    assert got.freed_nodes == ("n1",)
    assert {m.target.node for m in got.moves} <= {"n0", "n2"}
