"""The watchdog's decision: which processes on shared GPUs are ended, by which rule; which pods evicted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.enforce import verify
from agent.enforce import watchdog as wd
from agent.enforce.cgroup import PodRef
from agent.enforce.ending import Ended
from agent.enforce.watchdog import Rule
from agent.loop import Agent, AgentConfig
from agent.mpsdaemon.mps import MpsConfig, MpsSupervisor
from agent.nvml.base import MigDeviceInfo, ProcessInfo
from agent.nvml.sample import GpuSample, NodeSample
from agent.report.reporter import ReporterConfig
from agent.settings import Settings
from agent.simgpu.simulated import SimulatedNvml
from app.core import names
from app.core.model import Allocation
from app.core.pods import PodInfo, pod_info
from app.kube.calls import Request

SHARED, OTHER, MIG = (
    "GPU-aaaa",
    "GPU-bbbb",
    "GPU-cccc",
)  # GPU 0 shared (MPS), GPU 1 shared (no MPS), GPU 2 MIG
LIMIT = 4000


def pod(
    uid: str,
    gpu: int | None = 0,
    *,
    namespace: str = "ml",
    isolation: str | None = None,
    labels: Mapping[str, str] | None = None,
    container: str = "cid-main",
) -> dict[str, Any]:
    ann = {names.GPU_FRACTION: "0.25"}
    if gpu is not None:
        ann |= Allocation("n1", (gpu,), ((SHARED, OTHER)[gpu],), 250, LIMIT).to_annotations()
    if isolation:
        ann[names.ISOLATION] = isolation
    return {
        "metadata": {
            "uid": uid, "namespace": namespace, "name": f"pod-{uid}", "annotations": ann,
            "labels": dict(labels or {}),
        },
        "spec": {"containers": [{"name": "main"}, {"name": "sidecar"}]},
        "status": {"containerStatuses": [{"name": "main", "containerID": f"containerd://{container}"}]},
    }  # fmt: skip


def sample(procs: Mapping[str, tuple[tuple[int, int], ...]]) -> NodeSample:
    """GPUs by UUID with (pid, MiB) processes; the third GPU is MIG-enabled."""
    gpus = [
        GpuSample(
            i, u, "NVIDIA H100", "H100", 81559, processes=tuple(ProcessInfo(*p) for p in procs.get(u, ()))
        )
        for i, u in enumerate((SHARED, OTHER))
    ]
    mig = GpuSample(
        2, MIG, "NVIDIA H100", "H100", 81559, mig_enabled=True,
        mig_devices=(MigDeviceInfo(0, "MIG-1", 9984, 0),),
        processes=tuple(ProcessInfo(p, m, "MIG-1") for p, m in procs.get(MIG, ())),
    )  # fmt: skip
    return NodeSample(gpus=(*gpus, mig))


FACTS = wd.Facts(
    shared_gpus=frozenset({SHARED, OTHER}), mps_gpus=frozenset({SHARED}), mps_clients=frozenset()
)
POLICY = wd.Policy()


def decide(
    procs: Mapping[str, tuple[tuple[int, int], ...]],
    refs: Mapping[int, PodRef | None],
    objs: list[dict[str, Any]],
    *,
    facts: wd.Facts = FACTS,
    policy: wd.Policy = POLICY,
    others: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> wd.Decision:
    s = sample(procs)
    pods: dict[str, PodInfo] = {p.uid: p for p in map(pod_info, objs)}
    verdict = verify.verify(s, refs, pods)
    metas = wd.metas([*objs, *others])
    return wd.decide(s, refs, pods, verdict=verdict, metas=metas, facts=facts, policy=policy)


def rules(d: wd.Decision) -> dict[int, Rule]:
    return {e.pid: e.rule for e in d.endings}


A = PodRef("a", "cid-main")


def test_a_client_of_its_own_gpu_within_its_memory_is_left_alone() -> None:
    facts = wd.Facts(frozenset({SHARED, OTHER}), frozenset({SHARED}), mps_clients=frozenset({10}))
    assert decide({SHARED: ((10, 1000),)}, {10: A}, [pod("a")], facts=facts).endings == ()


TWO_CONTAINERS = pod("a") | {
    "status": {
        "containerStatuses": [
            {"name": "main", "containerID": "containerd://cid-main"},
            {"name": "sidecar", "containerID": "containerd://cid-side"},
        ]
    }
}


@pytest.mark.parametrize(
    ("procs", "refs", "objs", "want"),
    [
        pytest.param({SHARED: ((10, 100),)}, {10: None}, [], Rule.NO_POD, id="host-process"),
        pytest.param(
            {SHARED: ((10, 100),)}, {10: PodRef("x", "c")}, [], Rule.OTHER_POD, id="pod-gpupack-did-not-place"
        ),
        pytest.param({OTHER: ((10, 100),)}, {10: A}, [pod("a", 0)], Rule.NOT_ALLOCATED, id="not-its-gpu"),
        pytest.param({SHARED: ((10, 100),)}, {10: A}, [pod("a", None)], Rule.NO_ALLOCATION, id="no-alloc"),
        pytest.param(
            {SHARED: ((10, 100),)}, {10: PodRef("a", "cid-side")}, [TWO_CONTAINERS], Rule.WRONG_CONTAINER,
            id="other-container",
        ),
        pytest.param({SHARED: ((10, LIMIT + 1),)}, {10: A}, [pod("a")], Rule.OVER_MEMORY, id="over-memory"),
        pytest.param({SHARED: ((10, 100),)}, {10: A}, [pod("a")], Rule.NOT_MPS_CLIENT, id="plain-beside-mps"),
    ],
)  # fmt: skip
def test_each_rule(
    procs: Mapping[str, tuple[tuple[int, int], ...]],
    refs: Mapping[int, PodRef | None],
    objs: list[dict[str, Any]],
    want: Rule,
) -> None:
    others = [pod("x", None) | {"metadata": {"uid": "x", "namespace": "web", "name": "nginx"}}]
    d = decide(procs, refs, objs, others=others)
    assert rules(d) == {10: want}
    (e,) = d.endings
    text = wd.message(e, "ended with SIGKILL after 2.0 s")
    assert text.startswith(f"process 10 on GPU {e.gpu_index} ({e.gpu_uuid})") and wd.describe(e) in text


def test_the_event_names_the_process_the_gpu_and_the_rule() -> None:
    (e,) = decide({SHARED: ((10, 5000),)}, {10: A}, [pod("a")]).endings
    assert wd.message(e, "ended with SIGKILL after 3.5 s") == (
        "process 10 on GPU 0 (GPU-aaaa), 5000 MiB: its pod's processes on this GPU use more than the pod's "
        "4000 MiB limit; ended with SIGKILL after 3.5 s"
    )


def test_isolation_none_pods_are_not_held_to_mps() -> None:
    assert decide({SHARED: ((10, 100),)}, {10: A}, [pod("a", isolation="none")]).endings == ()


def test_unknown_client_list_judges_no_process_for_not_being_a_client() -> None:
    facts = wd.Facts(frozenset({SHARED, OTHER}), frozenset({SHARED}), mps_clients=None)
    assert decide({SHARED: ((10, 100),)}, {10: A}, [pod("a")], facts=facts).endings == ()


def test_never_touched() -> None:
    procs = {SHARED: ((1, 64), (2, 100), (3, 100), (4, 100)), MIG: ((5, 100),)}
    refs = {1: PodRef("daemon", "c"), 2: None, 3: PodRef("op", "c"), 4: PodRef("mon", "c"), 5: None}
    others = [
        pod("op", None, namespace="gpu-operator"),
        pod("mon", None, namespace="monitoring", labels={"gpupack.io/watchdog": "exempt"}),
        pod("daemon", None, namespace="gpupack-system"),
    ]
    policy = wd.Policy(frozenset({"gpu-operator"}), ("gpupack.io/watchdog", "exempt"))
    facts = wd.Facts(
        frozenset({SHARED, OTHER}), frozenset({SHARED}), mps_servers=frozenset({1}), mps_clients=frozenset(),
        fictional=frozenset({2}),
    )  # fmt: skip
    assert decide(procs, refs, [], facts=facts, policy=policy, others=others).endings == ()
    # The daemon's server known by its command name alone (cut at 15 characters, as /proc has it).
    facts2 = wd.Facts(frozenset({SHARED}), comms={1: "nvidia-cuda-mps"}, mps_clients=frozenset())
    assert decide({SHARED: ((1, 64),)}, refs, [], facts=facts2, others=others).endings == ()


def test_a_pod_not_listed_yet_is_asked_for_not_judged() -> None:
    d = decide({SHARED: ((10, 100),)}, {10: PodRef("new", "c")}, [])
    assert d.endings == () and d.unknown_pods == {"new"}


def test_over_memory_ends_the_largest_until_the_rest_fit() -> None:
    refs = {10: A, 11: A, 12: A}
    facts = wd.Facts(frozenset({SHARED}), frozenset({SHARED}), mps_clients=frozenset(refs))
    d = decide({SHARED: ((10, 1000), (11, 2500), (12, 1500))}, refs, [pod("a")], facts=facts)
    assert rules(d) == {11: Rule.OVER_MEMORY}  # 5000 MiB; without the 2500 MiB one, 2500 fit
    assert d.endings[0].limit_mib == LIMIT


def test_strikes_evict_once_at_the_threshold_and_never_with_zero() -> None:
    (e,) = decide({SHARED: ((10, 100),)}, {10: A}, [pod("a")]).endings
    policy = wd.Policy(evict_after=2)
    one = wd.strikes({}, [e])
    assert wd.to_evict({}, one, policy) == ()
    two = wd.strikes(one, [e])
    assert wd.to_evict(one, two, policy) == ("a",)
    assert wd.to_evict(two, wd.strikes(two, [e]), policy) == ()  # evicted once, not every cycle after
    assert wd.to_evict({}, {"a": 99}, wd.Policy(evict_after=0)) == ()


# --- generated cases: the rules as properties over random nodes ---

OWNERS = ("host", "other", "a", "none", "exempt", "server", "fiction")
OWNER_REFS: Mapping[str, PodRef | None] = {
    "host": None, "other": PodRef("x", "c"), "a": A, "none": PodRef("b", "cid-main"),
    "exempt": PodRef("op", "c"), "server": PodRef("daemon", "c"), "fiction": None,
}  # fmt: skip


Case = tuple[dict[str, list[tuple[int, int]]], dict[int, str], frozenset[int] | None]


@st.composite
def nodes(draw: st.DrawFn) -> Case:
    count = draw(st.integers(0, 8))
    procs: dict[str, list[tuple[int, int]]] = {}
    owner: dict[int, str] = {}
    for pid in range(100, 100 + count):
        gpu = draw(st.sampled_from((SHARED, SHARED, SHARED, OTHER, MIG)))  # mostly the MPS GPU
        procs.setdefault(gpu, []).append((pid, draw(st.integers(0, 6000))))
        owner[pid] = draw(st.sampled_from((*OWNERS, "a", "a", "a", "none")))  # mostly the two pods
    clients = draw(st.none() | st.frozensets(st.sampled_from(sorted(owner) or [0])))
    return procs, owner, clients


@settings(max_examples=300, deadline=None)
@given(nodes())
def test_generated_nodes(case: Case) -> None:
    procs, owner, clients = case
    refs = {pid: OWNER_REFS[o] for pid, o in owner.items()}
    objs = [pod("a", 0), pod("b", 0, isolation="none")]
    others = [pod("x", None, namespace="web"), pod("op", None, namespace="gpu-operator"), pod("daemon", None)]
    servers = frozenset(p for p, o in owner.items() if o == "server")
    fiction = frozenset(p for p, o in owner.items() if o == "fiction")
    facts = wd.Facts(frozenset({SHARED, OTHER}), frozenset({SHARED}), servers, clients, fictional=fiction)
    policy = wd.Policy(frozenset({"gpu-operator"}))
    d = decide(
        {g: tuple(ps) for g, ps in procs.items()}, refs, objs, facts=facts, policy=policy, others=others
    )
    got = rules(d)
    gpu_of = {pid: g for g, ps in procs.items() for pid, _ in ps}
    used = {pid: m for ps in procs.values() for pid, m in ps}
    for pid, o in owner.items():
        g = gpu_of[pid]
        if g == MIG or o in ("exempt", "server", "fiction"):
            assert pid not in got, "never touched"
        elif o == "host":
            assert got[pid] is Rule.NO_POD
        elif o == "other":
            assert got[pid] is Rule.OTHER_POD
        elif g == OTHER:
            assert got[pid] is Rule.NOT_ALLOCATED  # both pods are allocated GPU 0 only
        elif pid in got:
            assert got[pid] in (Rule.OVER_MEMORY, Rule.NOT_MPS_CLIENT)
            if got[pid] is Rule.NOT_MPS_CLIENT:
                assert o == "a" and clients is not None and pid not in clients
        else:
            # left alone on its own GPU: an MPS client (or not held to MPS) ...
            assert o == "none" or (clients is None or pid in clients)
    for o in ("a", "none"):  # ... and what is left of each pod on its GPU fits its limit
        mine = [pid for pid, w in owner.items() if w == o and gpu_of[pid] == SHARED]
        ended = [used[p] for p in mine if got.get(p) is Rule.OVER_MEMORY]
        left = sum(used[p] for p in mine) - sum(ended)
        assert left <= LIMIT
        assert not ended or left + min(ended) > LIMIT  # no more ended than it takes
        if sum(used[p] for p in mine) <= LIMIT:
            assert all(got.get(p) is not Rule.OVER_MEMORY for p in mine)


# --- the agent's cycle: what it does with a decision (the host side stands in: no process is signalled) ---


class Hands:
    """The host as the watchdog sees it: every process is `python3` and ends when asked."""

    def __init__(self) -> None:
        self.ended: list[int] = []

    def comm(self, pid: int) -> str:
        return "python3"

    def end(self, pid: int, ref: PodRef | None, mps_client: bool) -> Ended:
        self.ended.append(pid)
        return Ended(True, "ended with SIGKILL", 2.5)


def loop_agent(tmp_path: Path, policy: wd.Policy | None) -> tuple[Agent, Hands, list[Request]]:
    uid = "5a3e8d5c-8f0e-4d7e-9a52-3c1f1d2b7a10"
    path = tmp_path / "sim.yaml"
    procs = [{"pid": 4101, "used_mib": 3000, "pod_uid": uid, "container": "c1"}]
    path.write_text(yaml.safe_dump({"gpus": [{"model": "T4", "processes": procs}, {"model": "T4"}]}))
    sim = SimulatedNvml(path, "n1")
    alloc = Allocation("n1", (1,), (), 250, 2000)  # GPU 1; its process runs on GPU 0
    pod = {
        "metadata": {"uid": uid, "namespace": "ml", "name": "train",
                     "annotations": {names.GPU_FRACTION: "0.25", **alloc.to_annotations()}},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"containerStatuses": [{"name": "main", "containerID": "containerd://c1"}]},
    }  # fmt: skip
    sent: list[Request] = []

    def send(req: Request) -> dict[str, Any]:
        sent.append(req)
        return {"items": [pod]} if req.method == "GET" and req.path == "/api/v1/pods" else {}

    hands = Hands()
    config = AgentConfig("n1", ReporterConfig(heartbeat_s=30, min_interval_s=5, memory_threshold_mib=256))
    agent = Agent(
        replace(config, watchdog=policy), nvml=sim, resolver=sim, send=send, clock=lambda: 1.7e9, hands=hands,
        mps=MpsSupervisor(MpsConfig(binary=str(tmp_path / "none"), pipe_dir=tmp_path / "p")),
    )  # fmt: skip
    return agent, hands, sent


def test_each_ending_is_told_on_the_pod_and_the_pod_is_evicted_once_at_the_threshold(tmp_path: Path) -> None:
    agent, hands, sent = loop_agent(tmp_path, wd.Policy(evict_after=2))
    for _ in range(3):
        agent.step()
    assert hands.ended == [4101, 4101, 4101]
    events = [r.body for r in sent if r.path == "/api/v1/namespaces/ml/events"]
    told = [e["message"] for e in events if e["reason"] == wd.REASON]
    uuid0 = agent.nvml.uuid(0)
    assert (
        told
        == [
            f"process 4101 on GPU 0 ({uuid0}), 3000 MiB: its pod's allocation does not name this GPU; "
            "ended with SIGKILL after 2.5 s"
        ]
        * 3
    )
    assert [e["reason"] for e in events].count(wd.EVICTED_REASON) == 1
    assert [r.path for r in sent if r.path.endswith("/eviction")] == [
        "/api/v1/namespaces/ml/pods/train/eviction"
    ]


def test_with_the_watchdog_off_nothing_is_ended(tmp_path: Path) -> None:
    agent, hands, sent = loop_agent(tmp_path, None)
    agent.step()
    assert hands.ended == [] and not [r for r in sent if r.path.endswith("/eviction")]
    # the violation itself is still reported
    assert [r.body["reason"] for r in sent if r.path.endswith("/events")] == ["GpupackWrongGPU"]


def test_bad_settings_name_the_flag_the_value_and_the_rule() -> None:
    bad = Settings(node="n1", watchdog_evict_after=-1, watchdog_exempt_label="team").validate()
    assert [str(e) for e in bad] == [
        "watchdog_evict_after=-1: must be >= 0 (0: never evict)",
        "watchdog_exempt_label='team': must be one label as key=value, e.g. team=platform",
    ]
    assert Settings(node="n1", watchdog_exempt_label="team=gpu").watchdog_exemption == ("team", "gpu")
