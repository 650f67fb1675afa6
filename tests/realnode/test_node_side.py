"""The node side on a real kubelet + containerd 1.6: gpupack's RuntimeClass handler gives each MPS pod's GPU
container its own MPS directory and its share's env before its first process, with no hostPath in the pod,
for any uid, in `baseline` namespaces; it fails the container closed, with the reason, when the backend is
down; a restarted container gets its state again.

The MPS daemon is the stand-in (tests/standin/mps_control.py, multi-user) run by the chart's mps-daemon pod:
no GPU here. Its clients are the stand-in's own CUDA-client mode, run in the gpupack image from a ConfigMap.
"""

from __future__ import annotations

import json
import os
from typing import Any

from app.core import names
from app.kube.calls import MERGE_PATCH, Request
from app.kube.client import Kube
from tests.devcluster import Cluster, kubeletnode, wait_for
from tests.devcluster.identities import GPUPACK_NAMESPACE

from . import chart
from .pods import RUN_TIMEOUT_S, busybox_pod, idle_node, new_namespace, run_to_completion, wait_done

ENFORCE = "pod-security.kubernetes.io/enforce"
RECORD = "/run/gpupack/injection.json"
# The first thing the GPU container runs reads the handler's record and the boot clock; then what it holds.
FIRST = f"R=$(cat {RECORD}); U=$(cut -d' ' -f1 /proc/uptime); "
FIRST += 'echo "RECORD=$R"; echo "UPTIME=$U"; '
TENANT = FIRST + (
    'echo "UID=$(id -u)"; '
    'echo "MPSDIR=$(ls -A "$CUDA_MPS_PIPE_DIRECTORY" | tr "\\n" " ")"; '
    'echo "MPSINO=$(stat -c %i "$CUDA_MPS_PIPE_DIRECTORY")"; '
    'test -S "$CUDA_MPS_PIPE_DIRECTORY/control" && echo "CONTROL=socket"; '
    'echo "mine" > /dev/shm/secret-$HOSTNAME; sleep 20; '
    'echo "SHM=$(ls -A /dev/shm | tr "\\n" " ")"; '
    "echo \"END=$(cut -d' ' -f1 /proc/uptime)\"; env"
)


# A stand-in CUDA client that holds its MPS connection for a while, with the boot clock before and after.
CLIENT = (
    "U=$(cut -d' ' -f1 /proc/uptime); "
    "python3 /standin/mps_control.py client --hold --timeout 20 > /tmp/client & P=$!; "
    "sleep 8; kill $P; wait $P; "
    'echo "CLIENT=$(head -n1 /tmp/client)"; echo "UPTIME=$U"; '
    "echo \"END=$(cut -d' ' -f1 /proc/uptime)\"; "
    'echo "MPSDIR=$(ls -A "$CUDA_MPS_PIPE_DIRECTORY" | tr "\\n" " ")"'
)


def log_of(kube: Kube, ns: str, pod: str, container: str = "main", previous: bool = False) -> dict[str, str]:
    query = {"container": container, **({"previous": "true"} if previous else {})}
    text = kube.text(f"/api/v1/namespaces/{ns}/pods/{pod}/log", query)
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def container_id(status: dict[str, Any]) -> str:
    return str(status["containerID"]).removeprefix("containerd://")


def cri_started_at_ns(node: kubeletnode.RealNode, cid: str) -> int:
    """The container's start time as containerd's CRI plugin recorded it (ns, realtime clock)."""
    status = node.paths.containerd_root / "io.containerd.grpc.v1.cri" / "containers" / cid / "status"
    return int(json.loads(status.read_text())["StartedAt"])


def start_failures(pod: dict[str, Any]) -> list[str]:
    """'<reason>: <message>' of every state of the pod's containers that carries a message."""
    out = []
    for s in pod["status"].get("containerStatuses") or []:
        for part in (s.get("state") or {}, s.get("lastState") or {}):
            out += [f"{v.get('reason')}: {v['message']}" for v in part.values() if v.get("message")]
    return out


def tenant(name: str, uid: int | None, node: str) -> dict[str, Any]:
    pod = busybox_pod(name, {names.GPU_FRACTION: "0.5"}, {"main": ("sh", "-c", TENANT)}, node)
    if uid is not None:
        pod["spec"]["securityContext"] = {"runAsUser": uid, "runAsGroup": uid}
    return pod


def test_two_tenants_of_different_uids_share_a_gpu_from_baseline_namespaces(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    cluster, node = real_cluster
    # From an idle node (the earlier tests' pods removed), a whole GPU held first: the two halves can only
    # share the other one (the default policy may spread two halves over an idle node's two GPUs).
    idle_node(kube, node.name)
    held = new_namespace(kube)
    whole = {names.GPU_FRACTION: "1", names.ISOLATION: "none"}
    blocker = busybox_pod("whole", whole, {"main": ("sleep", "3600")}, node.name)
    kube.send(Request("POST", f"/api/v1/namespaces/{held}/pods", blocker))
    wait_for(
        lambda: (
            kube.send(Request("GET", f"/api/v1/namespaces/{held}/pods/whole"))["status"].get("phase")
            == "Running"
        ),
        RUN_TIMEOUT_S,
        "a pod holding a whole GPU",
        interval=0.5,
    )
    try:
        _two_tenants_share_a_gpu(kube, cluster, node)
    finally:
        kube.send(Request("DELETE", f"/api/v1/namespaces/{held}/pods/whole", {"gracePeriodSeconds": 0}))
        kube.send(Request("DELETE", f"/api/v1/namespaces/{held}"))


def _two_tenants_share_a_gpu(kube: Kube, cluster: Cluster, node: kubeletnode.RealNode) -> None:
    made = {}
    for name, uid in (("as-1000", 1000), ("as-root", None)):
        ns = new_namespace(kube, {ENFORCE: "baseline"})
        kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", tenant(name, uid, node.name)))
        made[name] = ns
    done = {}
    for name, ns in made.items():
        done[name] = wait_done(kube, ns, name)
    out = {name: log_of(kube, made[name], name) for name in made}
    pipe = chart.mps_pipe_dir(cluster)
    for name, pod in done.items():
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
        spec = pod["spec"]
        assert spec["runtimeClassName"] == "gpupack"
        assert not any("hostPath" in v for v in spec.get("volumes") or ()), spec.get("volumes")
        seen = out[name]
        assert seen["UID"] == ("1000" if name == "as-1000" else "0")
        # its own MPS directory: the daemon's socket, nothing else of the pipe dir, and no other pod's
        assert seen["MPSDIR"].split() == ["control"] and seen["CONTROL"] == "socket"
        assert int(seen["MPSINO"]) == os.stat(pipe / "pods" / pod["metadata"]["uid"]).st_ino
        assert seen[names.ENV_MPS_PIPE_DIRECTORY] == names.MPS_PIPE_DIRECTORY
        assert seen[names.ENV_MPS_THREAD_PERCENTAGE] == "50"
        # its own /dev/shm: the other tenant's file, written while both ran, is not there
        assert seen["SHM"].split() == [f"secret-{name}"]
    assert out["as-1000"]["MPSINO"] != out["as-root"]["MPSINO"]
    uuids = {pod["metadata"]["annotations"][names.ALLOC_GPU_UUIDS] for pod in done.values()}
    assert len(uuids) == 1, uuids  # one GPU, half each
    a, b = (out[n] for n in made)
    assert float(a["UPTIME"]) < float(b["END"]) and float(b["UPTIME"]) < float(a["END"]), (a, b)  # at once


def test_first_command_observes_the_state_injected_for_its_own_container(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    node = real_cluster[1]
    ns = new_namespace(kube, {ENFORCE: "baseline"})
    pod = busybox_pod("first", {names.GPU_FRACTION: "0.5"}, {"main": ("sh", "-c", FIRST + "env")}, node.name)
    done = run_to_completion(kube, ns, pod)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    (status,) = done["status"]["containerStatuses"]
    cid = container_id(status)
    seen = log_of(kube, ns, "first")
    record = json.loads(seen["RECORD"])
    assert record["container_id"] == cid
    assert (record["pod_uid"], record["namespace"], record["pod"], record["container"]) == (
        done["metadata"]["uid"],
        ns,
        "first",
        "main",
    )
    assert (
        record["env"][names.ENV_CUDA_VISIBLE_DEVICES]
        == done["metadata"]["annotations"][names.ALLOC_GPU_UUIDS]
    )
    assert {k: seen[k] for k in record["env"]} == record["env"]  # the process runs with what was recorded
    # Written before the container started: earlier than the CRI start, and than the first command's clock.
    assert record["realtime_ns"] < cri_started_at_ns(node, cid)
    assert record["boottime_ns"] < float(seen["UPTIME"]) * 1e9


DAEMON_DS = f"/apis/apps/v1/namespaces/{GPUPACK_NAMESPACE}/daemonsets/{chart.RELEASE}-mps-daemon"
# A node label no node has: the mps-daemon DaemonSet selecting it takes its pod off the node.
NO_NODE = "gpupack.io/test-no-mps-daemon"


def _daemon_on_node(kube: Kube, on: bool) -> None:
    """Take the MPS daemon pod off the node (its DaemonSet selects no node) or put it back."""
    selector = {"spec": {"template": {"spec": {"nodeSelector": {NO_NODE: None if on else "true"}}}}}
    kube.send(Request("PATCH", DAEMON_DS, selector, content_type=MERGE_PATCH))


def test_pod_whose_mps_backend_is_down_fails_with_the_reason_and_starts_once_it_is_back(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    cluster, node = real_cluster[0], real_cluster[1].name
    ns = new_namespace(kube, {ENFORCE: "baseline"})
    path = f"/api/v1/namespaces/{ns}/pods/down"
    control = chart.mps_pipe_dir(cluster) / "control"
    daemon_pods = f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/pods"
    selector = {
        "labelSelector": f"app.kubernetes.io/instance={chart.RELEASE},app.kubernetes.io/component=mps-daemon"
    }
    _daemon_on_node(kube, False)
    try:
        wait_for(
            lambda: (
                not kube.send(Request("GET", daemon_pods, query=selector))["items"] and not control.exists()
            ),
            90,
            "the MPS daemon pod gone from the node, its control socket with it",
            interval=0.5,
        )
        pod = busybox_pod("down", {names.GPU_FRACTION: "0.5"}, {"main": ("sh", "-c", FIRST)}, node)
        pod["spec"]["restartPolicy"] = "OnFailure"  # a start that failed is retried (with Never: pod Failed)
        kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", pod))
        seen: list[str] = []

        def refused() -> bool:
            seen[:] = start_failures(kube.send(Request("GET", path)))
            return any("the MPS control daemon does not answer at" in m for m in seen)

        wait_for(refused, RUN_TIMEOUT_S, "the container refused for its MPS backend", interval=0.5)
        assert any(f'container "main" of pod {ns}/down not started' in m for m in seen), seen
        print("status while the backend is down:", seen)
        events = kube.send(Request("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
        failed = [e["message"] for e in events if e.get("reason") == "Failed"]
        assert any("the MPS control daemon does not answer" in m for m in failed), failed
        # Never started without MPS: no running state, every attempt a StartError (the kubelet retries it).
        for s in kube.send(Request("GET", path))["status"].get("containerStatuses") or []:
            assert "running" not in s["state"], s
            ended = [p["terminated"] for p in (s["state"], s.get("lastState") or {}) if "terminated" in p]
            assert all(t["reason"] == "StartError" for t in ended), s
    finally:
        _daemon_on_node(kube, True)
    wait_for(lambda: chart.installed(kube) and control.exists(), 120, "the MPS daemon pod back on the node")
    wait_for(
        lambda: kube.send(Request("GET", path))["status"].get("phase") == "Succeeded",
        2 * RUN_TIMEOUT_S,
        "the pod started once the backend answered (the kubelet retries the create)",
        interval=1,
    )


def test_a_restarted_container_gets_its_state_again(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    node = real_cluster[1].name
    ns = new_namespace(kube, {ENFORCE: "baseline"})
    # Each instance keeps its record in the pod's emptyDir; the second prints both, then succeeds.
    once = FIRST + (
        'echo "$R" >> /work/records; '
        "if [ -e /work/once ]; then n=0; "
        'while read -r l; do n=$((n+1)); echo "REC$n=$l"; done < /work/records; '
        "env; exit 0; fi; touch /work/once; exit 1"
    )
    pod = busybox_pod("again", {names.GPU_FRACTION: "0.5"}, {"main": ("sh", "-c", once)}, node)
    pod["spec"]["restartPolicy"] = "OnFailure"
    pod["spec"]["volumes"] = [{"name": "work", "emptyDir": {}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "work", "mountPath": "/work"}]
    done = run_to_completion(kube, ns, pod)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    (status,) = done["status"]["containerStatuses"]
    assert status["restartCount"] == 1
    now, before = container_id(status), container_id(status["lastState"]["terminated"])
    assert now != before
    raw = kube.text(f"/api/v1/namespaces/{ns}/pods/again/log", {"container": "main"})
    seen = log_of(kube, ns, "again")
    assert "REC2" in seen, raw
    first, second = json.loads(seen["REC1"]), json.loads(seen["REC2"])
    assert (first["container_id"], second["container_id"]) == (before, now)  # each instance got its own
    assert json.loads(seen["RECORD"]) == second
    assert first["boottime_ns"] < second["boottime_ns"]
    for record in (first, second):
        assert record["mounts"] == second["mounts"]  # the same MPS directory: the pod's
        assert record["env"][names.ENV_MPS_THREAD_PERCENTAGE] == seen[names.ENV_MPS_THREAD_PERCENTAGE]
    assert seen[names.ENV_MPS_PIPE_DIRECTORY] == names.MPS_PIPE_DIRECTORY


def test_two_uids_both_get_a_server_at_once(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    """Multi-user MPS (the stand-in daemon with -M): clients of uid 1000 and of root attach at the same time
    through their own MPS directories; without -M the second uid would wait for the first's clients."""
    node = real_cluster[1].name
    image = chart.pods(kube, "agent")[0]["spec"]["containers"][0]["image"]  # has python3 for the client
    made = {}
    for name, uid in (("client-1000", 1000), ("client-root", 0)):
        ns = new_namespace(kube, {ENFORCE: "baseline"})
        standin = {
            "metadata": {"name": "standin"},
            "data": {"mps_control.py": chart.STANDIN_SOURCE.read_text()},
        }
        kube.send(Request("POST", f"/api/v1/namespaces/{ns}/configmaps", standin))
        pod = busybox_pod(name, {names.GPU_FRACTION: "0.5"}, {"main": ("sh", "-c", CLIENT)}, node)
        spec = pod["spec"]
        spec["securityContext"] = {"runAsUser": uid, "runAsGroup": uid}
        spec["volumes"] = [{"name": "standin", "configMap": {"name": "standin"}}]
        spec["containers"][0] |= {
            "image": image,
            "volumeMounts": [{"name": "standin", "mountPath": "/standin"}],
        }
        kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", pod))
        made[name] = ns
    out = {}
    for name, ns in made.items():
        assert wait_done(kube, ns, name)["status"]["phase"] == "Succeeded"
        out[name] = log_of(kube, ns, name)
    a, b = out["client-1000"], out["client-root"]
    assert a["MPSDIR"].split() == b["MPSDIR"].split() == ["control"]
    assert a["CLIENT"].startswith("server ") and a["CLIENT"] == b["CLIENT"], (
        a,
        b,
    )  # one root server for both
    assert " uid 0 " in a["CLIENT"]
    assert float(a["UPTIME"]) < float(b["END"]) and float(b["UPTIME"]) < float(a["END"]), (a, b)  # at once
