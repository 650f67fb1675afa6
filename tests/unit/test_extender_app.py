"""The extender's HTTP surface through TestClient with in-memory state and a fake app.kube layer."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core import names, podview
from app.core.errors import KubeError, PlacementReason
from app.core.model import Allocation, Demand, Node
from app.core.placement import Placement, Policy, TargetWorkload, place, registry
from app.core.request import pod_demand
from app.kube.assume import AssumeCache
from app.kube.cache import ClusterCache
from app.kube.calls import JsonDict, Request
from app.kube.gpunode import GPUNode, GPUNodeSpec, GPUNodeStatus, GpuSpec, GpuStatus
from extender.binder import Binder
from extender.config import Settings
from extender.main import create_app
from extender.metrics import PendingReason
from extender.rankings import Rankings
from extender.schemas import HostPriorityList
from extender.workloads import BUILTIN, LEARNED, WorkloadClock
from tests.static_runtime import StaticRuntime

NOW = 1_700_000_000.0


def gpunode(name: str, gpus: int = 2, mem: int = 16_384, model: str = "V100M16") -> JsonDict:
    spec = GPUNodeSpec(
        node_name=name,
        gpus=tuple(
            GpuSpec(uuid=f"GPU-{name}-{i}", index=i, model=model, product_name="Tesla", memory_mib=mem)
            for i in range(gpus)
        ),
    )
    status = GPUNodeStatus(
        heartbeat_time=NOW,
        gpus=tuple(GpuStatus(uuid=f"GPU-{name}-{i}", index=i, healthy=True) for i in range(gpus)),
    )
    return GPUNode.of(name, spec, status).wire()


# What the webhook gives the GPU container (the extender places only pods that carry it).
GPU_ENV: JsonDict = {
    "name": names.ENV_NVIDIA_VISIBLE_DEVICES,
    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{names.ALLOC_GPU_UUIDS}']"}},
}


def pod(
    name: str, milli: int = 500, count: int = 1, node: str = "", alloc: Allocation | None = None
) -> JsonDict:
    ann = {names.GPU_FRACTION: f"{milli / 1000:.2f}", names.GPU_FRACTION_NUM_DEVICES: str(count)}
    if alloc is not None:
        ann.update(alloc.to_annotations())
    res = {names.RESOURCE_GPU_MILLI: str(milli * count)}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": ann,
            "labels": {names.LABEL_MANAGED: "true"},
            "resourceVersion": "1",
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": res, "limits": res}, "env": [GPU_ENV]}],
        },
        "status": {"phase": "Running" if node else "Pending"},
    }


class FakeKube:
    """Pods in memory with resourceVersion preconditions on merge patches and bind-once Bindings."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self.pods: dict[str, JsonDict] = {}
        self.rv = 100
        self.sent: list[Request] = []
        self.fail: dict[str, KubeError] = {}  # "PATCH" / "POST" -> error to raise once
        self.patch_delay = 0.0
        # Set by bind_concurrently: a PATCH says it is on the wire, then waits for `hold` to open.
        self.on_wire: threading.Event | None = None
        self.hold: threading.Event | None = None
        self.lock = threading.Lock()

    def add(self, p: JsonDict) -> None:
        self.pods[p["metadata"]["name"]] = copy.deepcopy(p)
        self.cache.upsert_pod(p)

    def send(self, req: Request) -> JsonDict:
        self.sent.append(req)
        name = req.path.split("/")[6]
        err = self.fail.pop(req.method, None)
        if err is not None:
            raise err
        if req.method == "GET":
            return copy.deepcopy(self.pods[name])
        if req.method == "PATCH":
            time.sleep(self.patch_delay)
            if self.on_wire is not None and self.hold is not None:
                self.on_wire.set()
                self.hold.wait(10)
            with self.lock:
                p = self.pods[name]
                if req.body["metadata"]["resourceVersion"] != p["metadata"]["resourceVersion"]:
                    raise KubeError(409, "Conflict", "the object has been modified")
                for k, v in req.body["metadata"]["annotations"].items():
                    if v is None:
                        p["metadata"]["annotations"].pop(k, None)
                    else:
                        p["metadata"]["annotations"][k] = v
                return self._bump(p)
        assert req.method == "POST" and req.path.endswith("/binding")
        with self.lock:
            p = self.pods[name]
            if p["spec"]["nodeName"]:
                raise KubeError(409, "Conflict", "pod is already assigned to a node")
            want_rv = req.body["metadata"].get("resourceVersion")
            if want_rv and want_rv != p["metadata"]["resourceVersion"]:
                raise KubeError(409, "Conflict", "Precondition failed: ResourceVersion in precondition")
            p["spec"]["nodeName"] = req.body["target"]["name"]
            self._bump(p)
            return {"kind": "Status", "status": "Success"}

    def _bump(self, p: JsonDict) -> JsonDict:
        self.rv += 1
        p["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(p)

    def echo(self) -> None:
        """Deliver the current pods to the cache, as the watch would."""
        for p in self.pods.values():
            self.cache.upsert_pod(copy.deepcopy(p))

    def watch(
        self, path: str, query: Mapping[str, str | int | bool], timeout_s: int = 300
    ) -> Iterator[JsonDict]:
        raise AssertionError("not used")


class Env:
    def __init__(
        self, policy: str = "binpack", decide: bool = True, nodes: tuple[JsonDict, ...] = ()
    ) -> None:
        self.ttl_now = [0.0]
        self.cache = ClusterCache(AssumeCache(ttl_s=60, timer=lambda: self.ttl_now[0]), wall=lambda: NOW)
        self.cache.set_gpunodes(list(nodes) or [gpunode("n1"), gpunode("n2")])
        self.kube = FakeKube(self.cache)
        self.policy = registry.create(policy)
        self.binder = Binder(self.kube, self.cache, self.policy)
        self.runtime = StaticRuntime(self.cache, self.policy, self.binder, decide_in_filter=decide)
        self.app = create_app(Settings(policy=policy), runtime=self.runtime)
        self.client = TestClient(self.app)

    def filter(self, p: JsonDict, nodes: list[str]) -> JsonDict:
        r = self.client.post("/filter", json={"Pod": p, "Nodes": None, "NodeNames": nodes})
        assert r.status_code == 200
        out: JsonDict = r.json()
        return out

    def bind(self, p: JsonDict, node: str) -> str:
        m = p["metadata"]
        body = {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
        r = self.client.post("/bind", json=body)
        assert r.status_code == 200
        return str(r.json()["Error"])


def test_filter_decides_one_node_and_gives_reasons_only_when_none_passes() -> None:
    env = Env()
    env.kube.add(pod("big", 750, node="n1", alloc=Allocation("n1", (0,), (), 750, 12288)))
    env.kube.add(pod("big2", 750, node="n1", alloc=Allocation("n1", (1,), (), 750, 12288)))
    out = env.filter(pod("p", 500), ["n1", "n2", "ghost"])
    # A node passes: kube-scheduler binds there and never reads the other nodes' statuses.
    assert out == {
        "Nodes": None,
        "NodeNames": ["n2"],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    out = env.filter(pod("p", 500), ["n1", "ghost"])  # none passes: each node's reason, for the pod's event
    assert out["NodeNames"] == []
    assert out["FailedNodes"] == {"n1": "no GPU with 0.50 free: best has 0.25"}
    assert out["FailedAndUnresolvableNodes"] == {
        "ghost": "no GPUNode object for this node: the gpupack agent does not run here"
    }
    assert out["Error"] == ""
    assert env.runtime.pending.get("uid-p") == PendingReason.NO_FIT
    # Without decide-in-filter every node's status is reported, whether or not one passes.
    env2 = Env(decide=False)
    env2.kube.add(pod("big", 750, node="n1", alloc=Allocation("n1", (0,), (), 750, 12288)))
    env2.kube.add(pod("big2", 750, node="n1", alloc=Allocation("n1", (1,), (), 750, 12288)))
    out = env2.filter(pod("p", 500), ["n1", "n2", "ghost"])
    assert out["NodeNames"] == ["n2"] and set(out["FailedNodes"]) == {"n1"}
    assert set(out["FailedAndUnresolvableNodes"]) == {"ghost"}


def test_filter_decide_keeps_only_the_policy_choice() -> None:
    env = Env(policy="binpack")
    env.kube.add(pod("a", 250, node="n2", alloc=Allocation("n2", (0,), (), 250, 4096)))
    out = env.filter(pod("p", 500), ["n1", "n2"])
    assert out["NodeNames"] == ["n2"]  # best fit: the node already in use
    assert out["FailedNodes"] == {} and out["FailedAndUnresolvableNodes"] == {}  # n1 fits: no failure
    env2 = Env(policy="binpack", decide=False)
    assert env2.filter(pod("p", 500), ["n1", "n2"])["NodeNames"] == ["n1", "n2"]


class Gate:
    """A policy whose filter waits at a gate: a new shape being ranked, held as long as a test likes."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def filter(self, node: Node, demand: Demand) -> PlacementReason | None:
        self.entered.set()
        assert self.release.wait(10)
        return self.inner.filter(node, demand)


def test_probes_are_answered_while_a_new_shape_is_ranked() -> None:
    env = Env()
    gate = Gate(env.policy)
    env.runtime.rankings = Rankings(env.cache, gate)  # type: ignore[arg-type]
    body = {"Pod": pod("p", 500), "Nodes": None, "NodeNames": ["n1", "n2"]}
    slow: list[JsonDict] = []
    with TestClient(env.app) as client:  # one event loop for every request, as uvicorn serves them
        first = threading.Thread(target=lambda: slow.append(client.post("/filter", json=body).json()))
        first.start()
        try:
            assert gate.entered.wait(10)
            # The event loop is free: the probe answers while the first shape is still being judged.
            assert client.get("/healthz").status_code == 200
            assert first.is_alive() and not slow
        finally:
            gate.release.set()
            first.join(10)
        assert slow and slow[0]["NodeNames"] == ["n1"]
        # Warm now: the same shape is answered on the loop, with the same decision.
        body["Pod"] = pod("q", 500)
        assert client.post("/filter", json=body).json()["NodeNames"] == ["n1"]


def test_probes_are_answered_while_a_relist_holds_the_cache() -> None:
    env = Env(policy="binpack")
    body = {"Pod": pod("p", 500), "Nodes": None, "NodeNames": ["n1", "n2"]}
    listing, resume = threading.Event(), threading.Event()

    def slow_list() -> Iterator[JsonDict]:  # the cache is held while a GPUNode list is applied
        yield gpunode("n1")
        listing.set()
        assert resume.wait(10)
        yield gpunode("n2")

    answers: list[JsonDict] = []
    with TestClient(env.app) as client:
        assert client.post("/filter", json=body).json()["NodeNames"] == ["n1"]  # the shape is warm
        relist = threading.Thread(target=env.cache.set_gpunodes, args=(slow_list(),))
        relist.start()
        assert listing.wait(10)
        body["Pod"] = pod("q", 500)
        waiting = threading.Thread(target=lambda: answers.append(client.post("/filter", json=body).json()))
        waiting.start()
        try:
            assert client.get("/healthz").status_code == 200  # the loop is not stuck behind the relist
            assert waiting.is_alive() and not answers
        finally:
            resume.set()
            relist.join(10)
            waiting.join(10)
    assert answers and answers[0]["NodeNames"] == ["n1"]


def test_filter_invalid_request_is_unresolvable_everywhere() -> None:
    env = Env()
    bad = pod("p")
    bad["metadata"]["annotations"][names.GPU_FRACTION] = "nan"
    out = env.filter(bad, ["n1", "n2"])
    assert out["NodeNames"] == []
    assert set(out["FailedAndUnresolvableNodes"]) == {"n1", "n2"}
    assert out["FailedAndUnresolvableNodes"]["n1"].startswith("invalid GPU request: gpu-fraction='nan'")


def test_filter_refuses_a_pod_the_webhook_did_not_admit_and_says_why() -> None:
    env = Env()
    bare = pod("p")
    del bare["metadata"]["labels"]
    bare["spec"]["containers"][0].pop("env")
    out = env.filter(bare, ["n1", "n2"])
    assert out["NodeNames"] == []
    assert set(out["FailedAndUnresolvableNodes"]) == {"n1", "n2"}
    reason = out["FailedAndUnresolvableNodes"]["n1"]
    assert reason.startswith("not admitted by the gpupack webhook: metadata.labels[gpupack.io/managed]='': ")
    assert "containers[c].env[NVIDIA_VISIBLE_DEVICES]='<unset>'" in reason
    # Nothing was held for it: the same nodes still take a webhook-made pod of the same size.
    assert env.filter(pod("q"), ["n1", "n2"])["NodeNames"]


def test_filter_accepts_full_node_objects_when_not_cache_capable() -> None:
    env = Env(decide=False)
    args = {"Pod": pod("p"), "Nodes": {"items": [{"metadata": {"name": "n2"}}]}, "NodeNames": None}
    assert env.client.post("/filter", json=args).json()["NodeNames"] == ["n2"]


def test_prioritize_normalizes_raw_scores_to_0_10() -> None:
    env = Env(policy="binpack")
    env.kube.add(pod("a", 500, node="n2", alloc=Allocation("n2", (0,), (), 500, 8192)))
    r = env.client.post("/prioritize", json={"Pod": pod("p", 250), "Nodes": None, "NodeNames": ["n1", "n2"]})
    assert r.status_code == 200
    assert r.json() == [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 10}]
    # Encoded without the schema's models, the answer still is the wire format's HostPriorityList.
    assert HostPriorityList.model_validate_json(r.content).model_dump() == r.json()
    assert r.headers["content-type"] == "application/json"


def test_bind_writes_allocation_with_precondition_then_binding() -> None:
    env = Env()
    p = pod("p", 500)
    env.kube.add(p)
    assert env.bind(p, "n1") == ""
    kinds = [(r.method, r.path.rsplit("/", 1)[-1]) for r in env.kube.sent]
    assert kinds == [("PATCH", "p"), ("POST", "binding")]  # the pod comes from the informer's copy
    assert env.kube.sent[0].body["metadata"]["resourceVersion"] == "1"  # the copy's version
    assert env.kube.sent[1].body["metadata"]["resourceVersion"] == "101"  # what the patch produced
    stored = env.kube.pods["p"]
    assert Allocation.from_annotations(stored["metadata"]["annotations"]) == Allocation(
        "n1", (0,), ("GPU-n1-0",), 500, 8192
    )
    assert stored["spec"]["nodeName"] == "n1"
    assert env.cache.assume.get("uid-p") is not None  # held until the watch echo
    env.kube.echo()
    assert env.cache.assume.get("uid-p") is None


def test_bind_conflict_releases_the_hold() -> None:
    env = Env()
    p = pod("p")
    env.kube.add(p)
    real = env.kube.send

    def always_conflict(req: Request) -> JsonDict:
        if req.method == "PATCH":
            env.kube.sent.append(req)
            raise KubeError(409, "Conflict", "the object has been modified")
        return real(req)

    env.kube.send = always_conflict  # type: ignore[method-assign]
    assert env.bind(p, "n1").startswith("writing allocation: 409 Conflict")
    assert len(env.cache.assume) == 0
    # The informer's copy is tried, then the pod is read once and tried again; nothing more.
    assert [r.method for r in env.kube.sent] == ["PATCH", "GET", "PATCH"]


def test_bind_from_a_stale_informer_copy_reads_the_pod_once_and_binds() -> None:
    env = Env()
    p = pod("p", 500)
    env.kube.add(p)
    env.kube._bump(env.kube.pods["p"])  # e.g. a label added: the watch has not shown it yet
    assert env.bind(p, "n1") == ""
    kinds = [(r.method, r.path.rsplit("/", 1)[-1]) for r in env.kube.sent]
    assert kinds == [("PATCH", "p"), ("GET", "p"), ("PATCH", "p"), ("POST", "binding")]
    assert env.kube.sent[0].body["metadata"]["resourceVersion"] == "1"  # refused: nothing written
    assert env.kube.sent[2].body["metadata"]["resourceVersion"] == "101"  # the version just read
    assert env.kube.pods["p"]["spec"]["nodeName"] == "n1"
    assert Allocation.from_annotations(env.kube.pods["p"]["metadata"]["annotations"]) == Allocation(
        "n1", (0,), ("GPU-n1-0",), 500, 8192
    )
    assert env.cache.assume.get("uid-p") is not None  # one hold, until the watch echo


def test_bind_reads_the_pod_the_informer_has_not_shown() -> None:
    env = Env()
    p = pod("p", 500)
    env.kube.pods["p"] = copy.deepcopy(p)  # created, but the watch event is still on its way
    assert env.bind(p, "n1") == ""
    assert [r.method for r in env.kube.sent] == ["GET", "PATCH", "POST"]


def test_bind_of_a_recreated_pod_never_writes_with_the_old_copy() -> None:
    env = Env()
    old = pod("p", 500)
    env.kube.add(old)
    new = copy.deepcopy(old)
    new["metadata"]["uid"] = "uid-p2"
    env.kube.pods["p"] = new
    env.kube._bump(new)
    assert env.bind(old, "n1") == "pod was re-created (uid uid-p2, want uid-p)"
    assert env.kube.pods["p"]["spec"]["nodeName"] == ""
    assert names.ALLOC_NODE not in env.kube.pods["p"]["metadata"]["annotations"]
    assert len(env.cache.assume) == 0


def test_a_write_by_anyone_between_patch_and_binding_fences_the_binding() -> None:
    env = Env()
    p = pod("p")
    env.kube.add(p)
    real = env.kube.send

    def other_writer_in_between(req: Request) -> JsonDict:
        if req.path.endswith("/binding"):  # e.g. a new leader re-allocated the pod to n2's GPU
            env.kube.pods["p"]["metadata"]["annotations"][names.ALLOC_NODE] = "n2"
            env.kube._bump(env.kube.pods["p"])
        return real(req)

    env.kube.send = other_writer_in_between  # type: ignore[method-assign]
    assert env.bind(p, "n1").startswith("creating binding: 409 Conflict")
    stored = env.kube.pods["p"]
    assert stored["spec"]["nodeName"] == ""  # never bound to n1 under n2's allocation
    assert stored["metadata"]["annotations"][names.ALLOC_NODE] == "n2"  # and the other write stands


def test_failed_binding_removes_the_allocation_and_the_hold() -> None:
    env = Env()
    p = pod("p")
    env.kube.add(p)
    env.kube.fail["POST"] = KubeError(403, "Forbidden", "nope")
    assert env.bind(p, "n1") == "creating binding: 403 Forbidden: nope"
    assert names.ALLOC_NODE not in env.kube.pods["p"]["metadata"]["annotations"]
    assert len(env.cache.assume) == 0


def test_binding_with_lost_reply_keeps_the_allocation() -> None:
    env = Env()
    p = pod("p")
    env.kube.add(p)
    real = env.kube.send

    def bind_then_drop(req: Request) -> JsonDict:
        out = real(req)
        if req.path.endswith("/binding"):
            raise KubeError(0, "Unreachable", "read timed out")
        return out

    env.kube.send = bind_then_drop  # type: ignore[method-assign]
    assert env.bind(p, "n1").startswith("creating binding")
    assert env.kube.pods["p"]["metadata"]["annotations"][names.ALLOC_NODE] == "n1"  # removal hit 409
    assert env.cache.assume.get("uid-p") is not None  # still held: the share stays taken


def test_bind_no_fit_and_already_bound() -> None:
    env = Env(nodes=(gpunode("n1", gpus=1),))
    env.kube.add(pod("a", 800, node="n1", alloc=Allocation("n1", (0,), (), 800, 1000)))
    p = pod("p", 500)
    env.kube.add(p)
    assert env.bind(p, "n1") == "n1: no GPU with 0.50 free: best has 0.20"
    q = pod("q", 100, node="n1")
    env.kube.add(q)
    assert env.bind(q, "n1") == "pod is already bound to n1 without a gpupack allocation"
    assert env.bind(q, "n2") == "pod is already bound to n1; this bind asked for n2"


def test_a_retried_bind_that_finds_its_own_earlier_bind_done_succeeds() -> None:
    env = Env()
    p = pod("p", 500)
    env.kube.add(p)
    assert env.bind(p, "n1") == ""
    writes = len(env.kube.sent)
    assert env.bind(p, "n1") == ""  # the scheduler gave up waiting and retried: same answer
    assert [r.method for r in env.kube.sent[writes:]] == ["GET"]  # and nothing written again


def bind_concurrently(env: Env, calls: list[tuple[JsonDict, str]]) -> list[str]:
    """Bind `calls` at once, in a fixed order: every later bind arrives while the first one's PATCH is on
    the wire, and that PATCH is answered only once they have all joined it (no sleeps to race)."""
    errors: list[str] = [""] * len(calls)
    on_wire, hold, joined = threading.Event(), threading.Event(), threading.Semaphore(0)
    env.kube.on_wire, env.kube.hold = on_wire, hold
    join = env.binder._join

    def joining(*args: Any, **kwargs: Any) -> Any:
        joined.release()
        return join(*args, **kwargs)

    env.binder._join = joining  # type: ignore[method-assign]

    def run(i: int) -> None:
        errors[i] = env.bind(calls[i][0], calls[i][1])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    threads[0].start()
    assert on_wire.wait(10), "the first bind never reached the apiserver"
    for t in threads[1:]:
        t.start()
    for _ in threads[1:]:
        assert joined.acquire(timeout=10), "a later bind did not join the first"
    hold.set()
    for t in threads:
        t.join()
    return errors


def test_a_second_bind_of_the_same_pod_joins_the_first() -> None:
    env = Env()
    p = pod("p", 500)
    env.kube.add(p)
    assert bind_concurrently(env, [(p, "n1"), (p, "n1")]) == ["", ""]
    kinds = [(r.method, r.path.rsplit("/", 1)[-1]) for r in env.kube.sent]
    assert kinds == [("PATCH", "p"), ("POST", "binding")]  # one bind on the wire


def test_a_concurrent_bind_of_the_same_pod_to_another_node_names_both() -> None:
    env = Env()
    p = pod("p", 500)
    env.kube.add(p)
    errors = bind_concurrently(env, [(p, "n1"), (p, "n2")])
    assert errors == ["", "pod was bound to n1 by a concurrent bind; this bind asked for n2"]
    stored = env.kube.pods["p"]
    assert stored["spec"]["nodeName"] == "n1"
    assert stored["metadata"]["annotations"][names.ALLOC_NODE] == "n1"  # never n2's GPUs on n1
    assert sum(r.method == "PATCH" for r in env.kube.sent) == 1


def test_a_failed_first_bind_is_reported_to_a_joiner_for_another_node() -> None:
    env = Env()
    p = pod("p", 500)
    env.kube.add(p)
    env.kube.fail["POST"] = KubeError(403, "Forbidden", "nope")
    errors = bind_concurrently(env, [(p, "n1"), (p, "n2")])
    assert errors == [
        "creating binding: 403 Forbidden: nope",
        "a concurrent bind of this pod to n1 failed (creating binding: 403 Forbidden: nope);"
        " this bind asked for n2",
    ]
    assert env.kube.pods["p"]["spec"]["nodeName"] == ""
    assert len(env.cache.assume) == 0


class Fence:
    """can_write() answers from a script, one answer per call (the last one repeats)."""

    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_a_replica_that_lost_the_lease_writes_nothing() -> None:
    env = Env()
    p = pod("p", 500)
    env.kube.add(p)
    env.binder.can_write = Fence(False)
    assert env.bind(p, "n1").startswith("stopped before writing: this replica no longer holds")
    assert env.kube.sent == []
    assert len(env.cache.assume) == 0


def test_losing_the_lease_during_the_decision_releases_the_hold() -> None:
    env = Env()
    p = pod("p", 500)
    env.kube.add(p)
    env.binder.can_write = Fence(True, False)
    assert env.bind(p, "n1").startswith("stopped before writing")
    assert env.kube.sent == []
    assert len(env.cache.assume) == 0


def test_losing_the_lease_after_the_allocation_rolls_it_back_and_never_binds() -> None:
    env = Env()
    p = pod("p", 500)
    env.kube.add(p)
    env.binder.can_write = Fence(True, True, False)
    err = env.bind(p, "n1")
    assert err.endswith("no longer holds the leader lease; allocation rolled back")
    assert [r.method for r in env.kube.sent] == ["PATCH", "PATCH"]  # allocate, then remove
    stored = env.kube.pods["p"]
    assert stored["spec"]["nodeName"] == "" and names.ALLOC_NODE not in stored["metadata"]["annotations"]
    assert len(env.cache.assume) == 0


def test_two_racing_binds_for_the_last_share_exactly_one_wins() -> None:
    env = Env(nodes=(gpunode("n1", gpus=1),))
    env.kube.add(pod("a", 500, node="n1", alloc=Allocation("n1", (0,), (), 500, 8192)))
    p, q = pod("p", 500), pod("q", 500)
    env.kube.add(p)
    env.kube.add(q)
    env.kube.patch_delay = 0.05  # both are on the wire at once, after their decisions
    errors: dict[str, str] = {}
    start = threading.Barrier(2)

    def run(x: JsonDict) -> None:
        start.wait()
        errors[x["metadata"]["name"]] = env.bind(x, "n1")

    threads = [threading.Thread(target=run, args=(x,)) for x in (p, q)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(e == "" for e in errors.values()) == [False, True]
    loser = next(e for e in errors.values() if e)
    assert loser == "n1: no GPU with 0.50 free: best has 0.00"
    bound = [x for x in env.kube.pods.values() if x["spec"]["nodeName"]]
    assert len(bound) == 2  # the earlier pod and exactly one of the racers


def test_not_ready_refuses_scheduling_verbs() -> None:
    env = Env()
    env.runtime.ready = lambda: (False, "not the leader")  # type: ignore[method-assign]
    assert env.filter(pod("p"), ["n1"])["Error"] == "gpupack extender not ready: not the leader"
    assert env.client.post("/prioritize", json={"Pod": pod("p"), "NodeNames": ["n1"]}).status_code == 503
    assert env.bind(pod("p"), "n1") == "gpupack extender not ready: not the leader"
    # Each refusal asks the scheduler to drop its kept-alive connection, so its next call goes through
    # the Service to whichever replica leads now.
    for path, body in (
        ("/filter", {"Pod": pod("p"), "NodeNames": ["n1"]}),
        ("/prioritize", {"Pod": pod("p"), "NodeNames": ["n1"]}),
        ("/bind", {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n1"}),
    ):
        assert env.client.post(path, json=body).headers.get("connection") == "close", path
    env.runtime.ready = lambda: (True, "ready")  # type: ignore[method-assign]
    assert (
        env.client.post("/filter", json={"Pod": pod("p"), "NodeNames": ["n1"]}).headers.get("connection")
        != "close"
    )
    env.runtime.ready = lambda: (False, "not the leader")  # type: ignore[method-assign]
    r = env.client.get("/readyz")
    assert r.status_code == 503 and r.json()["reason"] == "not the leader"
    assert env.client.get("/healthz").status_code == 200


def test_healthz_fails_with_the_reason_when_a_worker_is_dead() -> None:
    env = Env()
    assert env.client.get("/healthz").json() == {"status": "ok"}
    env.runtime.alive = lambda: (False, "pods informer thread is dead")  # type: ignore[method-assign]
    r = env.client.get("/healthz")
    assert r.status_code == 503
    assert r.json() == {"status": "failing", "reason": "pods informer thread is dead"}


def test_state_and_explain() -> None:
    env = Env(policy="binpack")
    env.kube.add(pod("a", 250, node="n1", alloc=Allocation("n1", (1,), ("GPU-n1-1",), 250, 4096)))
    env.kube.add(pod("p", 500))
    st = env.client.get("/state").json()
    gpu1 = st["nodes"][0]["gpus"][1]
    assert (st["nodes"][0]["name"], gpu1["milliAllocated"], gpu1["pods"]) == ("n1", 250, ["ns/a"])
    assert st["pending"] == ["ns/p"]
    ex = env.client.get("/explain", params={"pod": "ns/p"}).json()
    assert ex["choice"] == {"node": "n1", "gpus": [1]}
    assert [row["fits"] for row in ex["nodes"]] == [True, True]
    assert ex["boundTo"] is None and ex["allocation"] is None
    assert env.client.get("/explain", params={"pod": "ns/none"}).status_code == 404
    bad = env.client.get("/explain", params={"pod": "no-namespace"})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["query", "pod"]


def test_metrics_expose_cluster_gauges_and_pre_created_outcomes() -> None:
    env = Env()
    env.kube.add(pod("a", 250, node="n1", alloc=Allocation("n1", (0,), (), 250, 4096)))
    p = pod("p", 1000)
    env.kube.add(p)
    env.filter(p, ["n1"])  # n1 has 0.75 + 1.0 free: whole GPU fits on gpu1
    text = env.client.get("/metrics").text
    for outcome in ("bound", "conflict", "no_fit", "error"):
        assert f'gpupack_extender_binds_total{{outcome="{outcome}"}}' in text
    assert 'gpupack_extender_gpu_allocated_milli{gpu="0",model="V100M16",node="n1"} 250.0' in text
    assert "gpupack_extender_packing_efficiency_ratio 0.25" in text
    assert 'gpupack_extender_pending_pods{reason="waiting"} 1.0' in text
    assert 'gpupack_extender_request_duration_seconds_bucket{le="0.0005",verb="bind"}' in text


def test_pending_reason_follows_the_last_refusal() -> None:
    env = Env(nodes=(gpunode("n1", gpus=1),))
    env.kube.add(pod("a", 800, node="n1", alloc=Allocation("n1", (0,), (), 800, 1000)))
    p = pod("p", 500)
    env.kube.add(p)
    env.filter(p, ["n1"])
    assert 'gpupack_extender_pending_pods{reason="no_fit"} 1.0' in env.client.get("/metrics").text


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (Settings(port=0), "port=0: must be in 1..65535"),
        (Settings(policy="best"), "policy='best': must be one of"),
        (Settings(renew_deadline_s=20), "renew_deadline_s=20: must be in (0, lease_duration_s=15)"),
        (
            Settings(live_within_s=200),
            "live_within_s=200: must be in (watch_timeout_s=45, assume_ttl_s=120.0)",
        ),
        (Settings(watch_timeout_s=0), "watch_timeout_s=0: must be >= 1"),
    ],
    ids=["port", "policy", "deadline", "live-after-ttl", "watch-timeout"],
)
def test_settings_validation(settings: Settings, message: str) -> None:
    errors = settings.validate()
    assert any(str(e).startswith(message) for e in errors), errors
    with pytest.raises(ValueError, match="invalid extender settings"):
        create_app(settings, runtime=Env().runtime)


def test_settings_report_every_error_at_once() -> None:
    assert len(Settings(port=0, policy="x", assume_ttl_s=0).validate()) == 3


def test_learned_workload_steers_an_unpinned_pod_off_the_scarce_model_as_the_simulator_does() -> None:

    fleet = (
        *(gpunode(f"a{i}", model="T4", mem=15109) for i in (1, 2)),
        *(gpunode(f"b{i}") for i in range(1, 5)),
    )
    names_ = [n["metadata"]["name"] for n in fleet]
    env = Env(policy="fragaware", nodes=fleet)
    for i in range(60):  # a queue of pods that run only on a T4
        p = pod(f"t4-{i}", 500)
        p["metadata"]["annotations"][names.GPU_MODEL] = "T4"
        env.kube.add(p)
    free = pod("free", 500)  # runs anywhere
    builtin_choice = env.filter(free, names_)["NodeNames"]
    assert env.runtime.refresh_workload(WorkloadClock(BUILTIN)) is not None  # the fleet is now known
    assert env.filter(free, names_)["NodeNames"] == builtin_choice  # no pinned shape: nothing scarce
    wl = env.runtime.refresh_workload(WorkloadClock(LEARNED))
    assert wl is not None and any(s.models == {"T4"} for s in wl.shapes)
    chosen = env.filter(free, names_)["NodeNames"]
    # What `gpupack simulate` does on this state: the workload of the pods on the fleet, then place().
    nodes = [n for n in env.cache.nodes().values() if n is not None]
    demands = [p.demand for p in env.cache.pods() if isinstance(p.demand, Demand)]
    sim_policy = registry.create("fragaware", TargetWorkload.from_demands(demands).on_fleet(nodes))
    demand = pod_demand(podview.read(free))
    assert isinstance(demand, Demand)
    expected = place(nodes, demand, sim_policy)
    assert isinstance(expected, Placement)
    assert chosen == [expected.node.name]
    assert chosen[0].startswith("b") and builtin_choice == ["a1"]  # off the T4s, which it took before
    assert env.binder.policy is env.runtime.policy  # bind re-checks with the same policy
