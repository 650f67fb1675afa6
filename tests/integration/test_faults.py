"""Fault tier: break the path between our processes and the control plane mid-burst, then audit every share.

Each test places a burst of fractional pods through the real kube-scheduler and the extender, injects one
fault while pods are still being created and bound, and then asserts through the API the promise "a GPU
share is never given to two pods and never forgotten":
  - no GPU carries more than 1000 milli of allocation annotations (live pods, bound or not),
  - every bound managed pod has an allocation whose gpupack.io/node equals its spec.nodeName,
  - every pod gets bound once the fault is over, and the leader's assume cache drains (no hold is kept).

The extender replicas run behind fault points (tests/devcluster/faults.py ExtenderRig): kube-scheduler
reaches them through a router that, like a Service, sends new connections to the Ready replica only (and,
with drain=True, cuts its connections to a replica that stopped leading), and they reach the apiserver
through a proxy the tests sever or freeze. GPUNodes are published once by the
test (no agents: they would add a process per node and nothing these faults exercise).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from podshapes import webhook_pod

from app.core import catalog
from tests.devcluster import Cluster, wait_for
from tests.devcluster.addons import Definitions
from tests.devcluster.faults import Audit, ExtenderRig, audit, publish_gpunodes

POOL = "gpupack.test/pool"
MODEL = "A100-40GB"
GPUS = 4
# 0.25 / 0.5 / 0.3 / 1.0 of a GPU, 8 GiB of memory, and 0.5 on each of two GPUs.
SHAPES: tuple[dict[str, int], ...] = (
    {"milli": 250}, {"milli": 500}, {"milli": 300}, {"milli": 1000},
    {"mem": 8192}, {"milli": 500, "count": 2},
)  # fmt: skip
BURST = 16  # about 8.6 GPUs of 12: room for every pod, not for a share handed out twice
HOLDS_NOT_RELEASED_ON_RELIST = (
    "holds left after the fault: a relist (ClusterCache.set_pods) must release a hold once it shows the pod "
    "bound with the held allocation, as the watch echo does, or it lingers until the assume TTL (120 s)"
)
SETTLE_S = 120  # from the end of a fault until every pod is bound (scheduler backoff is 1-2 s here)


def gpu_pod(name: str, namespace: str, milli: int = 0, mem: int = 0, count: int = 1) -> dict[str, Any]:
    """A pod as the webhook leaves it (tests/integration/podshapes.py), on this test's pool of nodes."""
    return webhook_pod(name, pool=(POOL, namespace), milli=milli, mem=mem, count=count)


def pods_json(core: Any, namespace: str) -> list[dict[str, Any]]:
    resp = core.list_namespaced_pod(namespace, _preload_content=False, _request_timeout=10)
    items: list[dict[str, Any]] = json.loads(resp.data)["items"]
    return items


def audit_of(core: Any, namespace: str) -> Audit | None:
    """The audit now, None while the apiserver does not answer (it may be restarting)."""
    try:
        return audit(pods_json(core, namespace))
    except Exception:  # ApiException, or urllib3's errors while the apiserver restarts
        return None


class Burst:
    """Creates pods in a thread, retrying each create until the apiserver takes it (it may be down)."""

    def __init__(self, core: Any, namespace: str, count: int) -> None:
        self.core, self.namespace, self.count = core, namespace, count
        self.created = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="burst", daemon=True)

    def _create(self, body: dict[str, Any]) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                self.core.create_namespaced_pod(self.namespace, body, _request_timeout=10)
                return
            except ApiException as exc:
                if exc.status == 409:  # an earlier try went through before its reply was lost
                    return
                if exc.status < 500 or time.monotonic() > deadline:
                    raise
            except Exception:  # connection refused/reset while the apiserver restarts
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def _run(self) -> None:
        try:
            for i in range(self.count):
                self._create(gpu_pod(f"p{i:03d}", self.namespace, **SHAPES[i % len(SHAPES)]))
                self.created += 1
                time.sleep(0.2)  # a stream, not one instant: faults land while pods still arrive
        except BaseException as exc:
            self.error = exc

    def start(self) -> Burst:
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join(timeout=180)
        assert not self._thread.is_alive(), "pod creation did not finish"
        if self.error is not None:
            raise self.error


def bound_count(core: Any, namespace: str) -> int:
    got = audit_of(core, namespace)
    return got.bound if got else 0


def holds_drained(rig: ExtenderRig, timeout_s: float = 30) -> bool:
    """The leader's assume cache empties: every hold was confirmed by the watch or released."""
    leader = rig.wait_leader(60)
    try:
        wait_for(lambda: rig.held(leader) == 0, timeout_s, "the leader's assume cache drained")
    except AssertionError:
        return False
    return True


def assert_promise_kept(
    core: Any, namespace: str, rig: ExtenderRig, expected: int, *, holds: bool = True
) -> Audit:
    """Every pod bound in time, nothing over-committed or misplaced, and (`holds`) no hold left behind."""

    def settled() -> Audit | None:
        got = audit_of(core, namespace)
        return got if got and got.bound == expected else None

    try:
        final = wait_for(settled, SETTLE_S, f"all {expected} pods bound after the fault")
    finally:
        last = audit_of(core, namespace)
        if last is not None:  # whatever happened, a share handed out twice is the first thing to report
            assert last.ok, last.to_json()
    assert final.ok, final.to_json()
    assert final.pods == expected and not final.stranded, final.to_json()
    if holds:
        assert holds_drained(rig), "the leader still holds shares that the API shows bound"
    return final


@pytest.fixture(scope="module")
def definitions(cluster: Cluster, kube: Any) -> Iterator[None]:
    """The GPUNode CRD, the chart's RBAC and admission policies, the policies removed at the module's end.

    The policies stay in effect for later modules otherwise, and their agent-own-node rule refuses the
    simulated agents that other modules start with tokens naming no node.
    """
    admission = client.AdmissionregistrationV1Api(kube)

    def policies() -> tuple[set[str], set[str]]:
        return (
            {p.metadata.name for p in admission.list_validating_admission_policy().items},
            {b.metadata.name for b in admission.list_validating_admission_policy_binding().items},
        )

    before = policies()
    Definitions().start(cluster, [])
    yield
    after = policies()
    for name in after[1] - before[1]:
        admission.delete_validating_admission_policy_binding(name)
    for name in after[0] - before[0]:
        admission.delete_validating_admission_policy(name)


@pytest.fixture
def rigs(cluster: Cluster, definitions: None) -> Iterator[Callable[..., ExtenderRig]]:
    """rigs(replicas=1, drain=False): extenders behind the router and the api proxy, stopped afterwards."""
    made: list[ExtenderRig] = []

    def make(replicas: int = 1, drain: bool = False) -> ExtenderRig:
        rig = ExtenderRig(
            cluster, replicas=replicas, policy="binpack", lease_duration_s=3, drain_on_failover=drain
        )
        made.append(rig)
        return rig.start()

    yield make
    for rig in made:
        rig.stop()


@pytest.fixture
def pool(cluster: Cluster, gpu_nodes: Callable[..., list[str]], namespace: str) -> list[str]:
    """Three 4-GPU nodes for this test's pods only, their GPUNodes published."""
    nodes = gpu_nodes(3, gpus_per_node=GPUS, model=MODEL, labels={POOL: namespace})
    publish_gpunodes(cluster.kubeconfig, nodes, GPUS, MODEL)
    return nodes


def test_pods_fit_the_pool() -> None:
    """The burst's arithmetic: every pod fits, well below what would force a share to be reused."""
    mem = catalog.lookup(MODEL).memory_mib
    milli = sum(
        s.get("milli", -(-s.get("mem", 0) * 1000 // mem)) * s.get("count", 1)
        for s in (SHAPES[i % len(SHAPES)] for i in range(BURST))
    )
    assert milli <= 3 * GPUS * 1000 * 0.75, milli


def test_extender_cut_from_the_apiserver_mid_burst(
    rigs: Callable[..., ExtenderRig], pool: list[str], core: Any, namespace: str
) -> None:
    rig = rigs()
    burst = Burst(core, namespace, BURST).start()
    wait_for(lambda: bound_count(core, namespace) >= 3, 60, "first pods bound")
    cut = rig.sever_api(refuse_s=4)  # watches and in-flight writes reset, new connections refused 4 s
    assert cut >= 2, "the extender's two watches at least went through the proxy"
    burst.join()
    assert_promise_kept(core, namespace, rig, BURST, holds=False)
    assert holds_drained(rig), HOLDS_NOT_RELEASED_ON_RELIST


def test_bind_slower_than_the_scheduler_timeout(
    cluster: Cluster, rigs: Callable[..., ExtenderRig], pool: list[str], core: Any, namespace: str
) -> None:
    """Freeze the extender's API path: its bind hangs past kube-scheduler's 5 s httpTimeout, then lands."""
    rig = rigs()
    log = cluster.log_path("kube-scheduler")
    offset = log.stat().st_size
    burst = Burst(core, namespace, BURST).start()
    wait_for(lambda: bound_count(core, namespace) >= 3, 60, "first pods bound")
    rig.freeze_api()
    try:

        def bind_timed_out() -> bool:
            with log.open("rb") as fh:
                fh.seek(offset)
                text = fh.read().decode("utf-8", "replace")
            return any("/bind" in ln and ("Timeout" in ln or "deadline" in ln) for ln in text.splitlines())

        wait_for(bind_timed_out, 30, "kube-scheduler logging an extender bind timeout")
    finally:
        rig.thaw_api()
    burst.join()
    assert_promise_kept(core, namespace, rig, BURST)


def test_apiserver_killed_and_restarted_mid_burst(
    cluster: Cluster, rigs: Callable[..., ExtenderRig], pool: list[str], core: Any, namespace: str
) -> None:
    rig = rigs()
    burst = Burst(core, namespace, BURST).start()
    wait_for(lambda: bound_count(core, namespace) >= 3, 60, "first pods bound")
    cluster.restart_process("kube-apiserver")  # SIGKILL; same port, certs, flags; etcd keeps the data
    before = audit_of(core, namespace)
    assert before is not None and before.bound >= 3, "the restarted apiserver serves what etcd kept"
    burst.join()
    assert_promise_kept(core, namespace, rig, BURST)


def freeze_the_leader_mid_burst(rig: ExtenderRig, core: Any, namespace: str, progress_s: float = 60) -> None:
    burst = Burst(core, namespace, BURST).start()
    wait_for(lambda: bound_count(core, namespace) >= 3, 60, "first pods bound")
    old = rig.wait_leader(10)
    rig.freeze_replica(old)
    try:
        new = rig.wait_leader(30, but=old)  # the standby took the lease and is Ready
        at_handover = bound_count(core, namespace)
        wait_for(
            lambda: bound_count(core, namespace) > at_handover, progress_s, "binds through the new leader"
        )
    finally:
        rig.resume_replica(old)
    burst.join()
    assert_promise_kept(core, namespace, rig, BURST, holds=False)
    # The resumed replica found its lease gone: it stays a standby, so there is still one leader.
    wait_for(lambda: not rig.ready(old, timeout_s=2), 10, "the old leader not Ready after SIGCONT")
    assert rig.ready(new)
    assert holds_drained(rig), HOLDS_NOT_RELEASED_ON_RELIST  # the new leader relisted when it took over


def test_leader_frozen_mid_burst_and_the_lease_handed_over(
    rigs: Callable[..., ExtenderRig], pool: list[str], core: Any, namespace: str
) -> None:
    """The router drops connections to a replica that stopped leading, so the scheduler reconnects."""
    freeze_the_leader_mid_burst(rigs(replicas=2, drain=True), core, namespace)


def test_failover_behind_a_plain_service(
    rigs: Callable[..., ExtenderRig], pool: list[str], core: Any, namespace: str
) -> None:
    """The leader loses the apiserver (not the scheduler): the standby leads, and binds must follow it."""
    rig = rigs(replicas=2, drain=False)
    burst = Burst(core, namespace, BURST).start()
    wait_for(lambda: bound_count(core, namespace) >= 3, 60, "first pods bound")
    old = rig.wait_leader(10)
    rig.sever_api(refuse_s=3 * rig.lease_duration_s, replica=old)  # it cannot renew: the lease moves
    rig.wait_leader(30, but=old)
    at_handover = bound_count(core, namespace)
    wait_for(lambda: bound_count(core, namespace) > at_handover, 20, "binds through the new leader")
    burst.join()
    assert_promise_kept(core, namespace, rig, BURST, holds=False)
