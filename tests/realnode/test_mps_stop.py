"""Stopping a busy MPS pod on a real kubelet + containerd node: its GPU neighbour keeps working.

Two pods share one GPU, each running a busy MPS client. One is stopped the ways users stop pods (`kubectl
delete pod` with its grace period, `--grace-period=0 --force`, the Eviction API); each time the other pod's
client finishes its work with no error, because gpupack-runc drains the stopped container's clients through
the daemon before the kill. With the drain turned off (`agent.mps.drainTimeoutSeconds: 0`) the neighbour
fails, so these tests can fail. Also here: a daemon that refuses gpupack's defaults keeps new MPS pods from
starting, with the reason, and a `gpu-memory: 2Gi` pod can allocate what the docs promise.

STAND-INS: the MPS daemon and the CUDA clients are tests/standin/mps_control.py, which follows the measured
table (docs/node-side.md, "MPS as measured": a busy client killed breaks its server's other clients, 4 of 4;
ended by terminate_client first, the others finish, 2 of 2; the context's 514 MiB counts against the pinned
limit). No GPU here.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from app.core import names
from app.kube.calls import Request
from app.kube.client import Kube
from tests.devcluster import Cluster, kubeletnode, wait_for
from tests.devcluster.identities import GPUPACK_NAMESPACE
from tests.devcluster.poll import WaitTimeoutError

from . import chart
from .pods import RUN_TIMEOUT_S, busybox_pod, idle_node, new_namespace, wait_done

ENFORCE = "pod-security.kubernetes.io/enforce"
CLIENT = "python3 /standin/mps_control.py client"
# The stopped pod: a busy client for a long time. Its shell forwards SIGTERM (as an init process that
# handles it) so that a stop reaches the client while its work is in flight.
# (single quotes: $P is read when the trap runs, after the client started)
VICTIM = f"trap 'kill -TERM $P; wait $P; exit 143' TERM; {CLIENT} --work 600 & P=$!; wait $P"
NEIGHBOUR = f'{CLIENT} --work 20; echo "EXIT=$?"'


def _pod_path(ns: str, name: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods/{name}"


def client_pod(
    kube: Kube, ns: str, name: str, script: str, *, node: str, annotations: dict[str, str]
) -> None:
    """A pod running `script` in the gpupack image (python3) with the stand-in at /standin."""
    image = chart.pods(kube, "agent")[0]["spec"]["containers"][0]["image"]
    pod = busybox_pod(name, annotations, {"main": ("sh", "-c", script)}, node)
    spec = pod["spec"]
    spec.pop("terminationGracePeriodSeconds")  # the default, 30 s, as users have it
    spec["volumes"] = [{"name": "standin", "configMap": {"name": "standin"}}]
    spec["containers"][0] |= {"image": image, "volumeMounts": [{"name": "standin", "mountPath": "/standin"}]}
    kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", pod))


def standin_namespace(kube: Kube) -> str:
    ns = new_namespace(kube, {ENFORCE: "baseline"})
    data = {"mps_control.py": chart.STANDIN_SOURCE.read_text()}
    kube.send(
        Request(
            "POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "standin"}, "data": data}
        )
    )
    return ns


def report(kube: Kube, ns: str, name: str) -> str:
    """The pod's status, its log, its namespace's events and the agent's last lines (for a failure)."""
    pod = kube.send(Request("GET", _pod_path(ns, name)))
    events = [f"{e.get('reason')}: {e.get('message')}" for e in
              kube.send(Request("GET", f"/api/v1/namespaces/{ns}/events"))["items"]]  # fmt: skip
    agent = chart.pods(kube, "agent")[0]["metadata"]["name"]
    tail = kube.text(f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/pods/{agent}/log", {"tailLines": "30"})
    return (f"status: {json.dumps(pod.get('status'))}\nlog: {log(kube, ns, name)}\nevents: {events}\n"
            f"agent:\n{tail}")  # fmt: skip


def log(kube: Kube, ns: str, name: str) -> str:
    try:
        return kube.text(f"{_pod_path(ns, name)}/log", {"container": "main"})
    except Exception:  # not started yet
        return ""


@contextlib.contextmanager
def one_gpu_left(kube: Kube, node: str) -> Iterator[None]:
    """The node idle, then one of its two GPUs held whole: the two halves that follow share the other."""
    idle_node(kube, node)
    ns = new_namespace(kube)
    whole = {names.GPU_FRACTION: "1", names.ISOLATION: "none"}
    kube.send(
        Request(
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            busybox_pod("whole", whole, {"main": ("sleep", "3600")}, node),
        )
    )
    wait_for(
        lambda: kube.send(Request("GET", _pod_path(ns, "whole")))["status"].get("phase") == "Running",
        RUN_TIMEOUT_S, "a pod holding a whole GPU", interval=0.5,
    )  # fmt: skip
    try:
        yield
    finally:
        kube.send(Request("DELETE", f"/api/v1/namespaces/{ns}"))


def stop(kube: Kube, ns: str, name: str, how: str) -> None:
    if how == "delete":
        kube.send(Request("DELETE", _pod_path(ns, name)))
    elif how == "force":
        kube.send(
            Request(
                "DELETE", _pod_path(ns, name), {"gracePeriodSeconds": 0, "propagationPolicy": "Background"}
            )
        )
    else:
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
        }
        kube.send(Request("POST", f"{_pod_path(ns, name)}/eviction", eviction))


def neighbour_after_a_stop(kube: Kube, node: str, how: str) -> tuple[dict[str, Any], str]:
    """Two busy MPS pods on one GPU; `how` stops one; the other pod as it ended, and its log."""
    ns = standin_namespace(kube)
    half = {names.GPU_FRACTION: "0.5"}
    client_pod(kube, ns, "victim", VICTIM, node=node, annotations=half)
    client_pod(kube, ns, "neighbour", NEIGHBOUR, node=node, annotations=half)
    for name in ("victim", "neighbour"):
        try:
            wait_for(
                lambda n=name: "server " in log(kube, ns, n),
                RUN_TIMEOUT_S,
                f"{name}'s client served",
                interval=0.5,
            )
        except WaitTimeoutError as exc:
            raise AssertionError(f"{exc}\n{report(kube, ns, name)}") from None
    pods = {n: kube.send(Request("GET", _pod_path(ns, n))) for n in ("victim", "neighbour")}
    uuids = {p["metadata"]["annotations"][names.ALLOC_GPU_UUIDS] for p in pods.values()}
    assert len(uuids) == 1, uuids  # one GPU, half each
    stop(kube, ns, "victim", how)
    done = wait_done(kube, ns, "neighbour")
    return done, log(kube, ns, "neighbour")


@pytest.mark.parametrize("how", ["delete", "force", "evict"])
def test_stopping_a_busy_mps_pod_leaves_its_neighbours_work_intact(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, how: str
) -> None:
    node = real_cluster[1].name
    with one_gpu_left(kube, node):
        done, out = neighbour_after_a_stop(kube, node, how)
    assert "EXIT=0" in out and "\ndone" in out, f"{how}: the neighbour failed:\n{out}"
    assert done["status"]["phase"] == "Succeeded", done["status"]


def set_drain_timeout(kube: Kube, cluster: Cluster, helm_bin: str, seconds: int) -> None:
    """Upgrade the release with agent.mps.drainTimeoutSeconds, and wait for an agent running with it."""
    before = {p["metadata"]["name"] for p in chart.pods(kube, "agent")}
    chart.helm(helm_bin, cluster, "upgrade", chart.RELEASE, str(chart.CHART), "--reuse-values",
               "--set", f"agent.mps.drainTimeoutSeconds={seconds}")  # fmt: skip

    def running() -> bool:
        agents = chart.pods(kube, "agent")
        args = agents[0]["spec"]["containers"][0].get("args", []) if len(agents) == 1 else []
        return (
            len(agents) == 1 and agents[0]["metadata"]["name"] not in before
            and f"--mps-drain-timeout={seconds}s" in args and chart.installed(kube)
        )  # fmt: skip

    wait_for(running, 240, f"an agent with --mps-drain-timeout={seconds}s", interval=1)


def test_without_the_drain_a_stopped_busy_pod_breaks_its_neighbour(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, helm_bin: str
) -> None:
    cluster, node = real_cluster[0], real_cluster[1].name
    set_drain_timeout(kube, cluster, helm_bin, 0)
    try:
        with one_gpu_left(kube, node):
            done, out = neighbour_after_a_stop(kube, node, "delete")
    finally:
        set_drain_timeout(kube, cluster, helm_bin, 5)
    assert "error cudaErrorIllegalAddress" in out and "EXIT=1" in out, out
    assert done["status"]["phase"] == "Succeeded", done["status"]  # its shell reported the failure


def test_a_2gi_pod_can_allocate_what_the_docs_promise(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    """docs/node-side.md, "Memory a share can use": 2 048 MiB less the context's 514 MiB, within 2 %."""
    node = real_cluster[1].name
    ns = standin_namespace(kube)
    client_pod(kube, ns, "two-gi", f"{CLIENT} --memory", node=node, annotations={names.GPU_MEMORY: "2Gi"})
    assert wait_done(kube, ns, "two-gi")["status"]["phase"] == "Succeeded"
    (line,) = [ln for ln in log(kube, ns, "two-gi").splitlines() if ln.startswith("usable ")]
    assert abs(int(line.split()[1]) - (2048 - 514)) <= 0.02 * 2048, line


def test_a_daemon_that_refuses_gpupacks_defaults_keeps_new_mps_pods_out_with_the_reason(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, helm_bin: str
) -> None:
    """The agent reaches the daemon only through `control` (its privileged socket gone): every default is
    refused with the daemon's words, exit 0. The GPUNode says MPS is not running, with those words, and a new
    MPS pod's container does not start; a new daemon pod puts things right."""
    cluster, node = real_cluster[0], real_cluster[1].name
    pipe = chart.mps_pipe_dir(cluster)
    gpunode = f"/apis/gpupack.io/v1alpha1/gpunodes/{node}"
    idle_node(kube, node)
    (pipe / "control_privileged").unlink()
    before = {p["metadata"]["name"] for p in chart.pods(kube, "agent")}
    # A new agent (a changed default) configures the daemon afresh, through `control` only now.
    chart.helm(helm_bin, cluster, "upgrade", chart.RELEASE, str(chart.CHART), "--reuse-values",
               "--set", "agent.mps.defaultActiveThreadPercentage=90")  # fmt: skip
    try:

        def refused() -> bool:
            agents = chart.pods(kube, "agent")
            if not agents or agents[0]["metadata"]["name"] in before:
                return False
            mps = kube.send(Request("GET", gpunode)).get("status", {}).get("mps", {})
            return mps.get("state") == "starting" and "Insufficient privileges" in mps.get("message", "")

        wait_for(refused, 240, "the GPUNode reporting the daemon's refusal", interval=1)
        status = kube.send(Request("GET", gpunode))["status"]
        print("GPUNode status.mps while refused:", json.dumps(status["mps"]))
        ns = new_namespace(kube, {ENFORCE: "baseline"})
        pod = busybox_pod("late", {names.GPU_FRACTION: "0.5"}, {"main": ("true",)}, node)
        pod["spec"]["restartPolicy"] = "OnFailure"
        kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", pod))

        def said() -> str:
            """The scheduler's and the kubelet's words on the pod (placement refuses it where the GPUNode
            says MPS is not running; a container placed before the GPUNode said so is refused at create)."""
            p = kube.send(Request("GET", _pod_path(ns, "late")))
            conds = " ".join(c.get("message", "") for c in p["status"].get("conditions") or [])
            states = " ".join(
                v.get("message", "")
                for s in p["status"].get("containerStatuses") or []
                for part in (s.get("state") or {}, s.get("lastState") or {})
                for v in part.values()
            )
            return conds + " " + states

        wait_for(
            lambda: "Insufficient privileges" in said() or "isolation=mps" in said(),
            RUN_TIMEOUT_S, "the MPS pod kept from starting with the reason", interval=1,
        )  # fmt: skip
        assert kube.send(Request("GET", _pod_path(ns, "late")))["status"].get("phase") != "Succeeded"
        print("the MPS pod while the daemon refuses:", said())
    finally:
        chart.helm(helm_bin, cluster, "upgrade", chart.RELEASE, str(chart.CHART), "--reuse-values",
                   "--set", "agent.mps.defaultActiveThreadPercentage=100")  # fmt: skip
        for p in chart.pods(kube, "mps-daemon"):  # OnDelete: a new daemon pod makes both sockets again
            kube.send(
                Request("DELETE", f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/pods/{p['metadata']['name']}")
            )
        wait_for(
            lambda: (pipe / "control_privileged").exists() and chart.installed(kube)
            and kube.send(Request("GET", gpunode)).get("status", {}).get("mps", {}).get("state") == "running",
            240, "a new MPS daemon configured by the agent", interval=1,
        )  # fmt: skip


def test_changing_the_agents_node_selector_leaves_the_mps_daemon_pod_alone(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, helm_bin: str
) -> None:
    """The daemon's death ends every MPS client on the node: an upgrade that moves the agent must not take
    the daemon pod with it (agent.mps.daemon.nodeSelector null keeps what the installed daemon has)."""
    cluster = real_cluster[0]
    (daemon,) = chart.pods(kube, "mps-daemon")
    before = json.loads(chart.helm(helm_bin, cluster, "get", "values", chart.RELEASE, "--output", "json"))
    moved = json.loads(json.dumps(before))
    agent = moved.setdefault("agent", {})
    agent["nodeSelector"] = {**(agent.get("nodeSelector") or {}), "gpupack.io/test-elsewhere": "true"}
    chart.helm(
        helm_bin, cluster, "upgrade", chart.RELEASE, str(chart.CHART), "--reset-values", values_doc=moved
    )
    try:
        wait_for(lambda: not chart.pods(kube, "agent"), 120, "the agent pod gone from the node", interval=1)
        (still,) = chart.pods(kube, "mps-daemon")
        assert still["metadata"]["uid"] == daemon["metadata"]["uid"]
        assert chart.mps_control(cluster, "get_server_list").strip().isdigit()
    finally:
        chart.helm(helm_bin, cluster, "upgrade", chart.RELEASE, str(chart.CHART), "--reset-values",
                   values_doc=before)  # fmt: skip
        wait_for(lambda: chart.installed(kube), 240, "the agent back on the node", interval=1)
    (after,) = chart.pods(kube, "mps-daemon")
    assert after["metadata"]["uid"] == daemon["metadata"]["uid"]
