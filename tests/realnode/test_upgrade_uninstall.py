"""Upgrades and restarts never interrupt running GPU work; `helm uninstall` leaves nothing behind.

Two pods hold a long-lived client of the node's MPS daemon, a STAND-IN (tests/standin/mps_control.py: no
GPU, no NVIDIA binary here) run by the chart's mps-daemon DaemonSet, one pod on each simulated GPU. Then, in
file order: `helm upgrade` to a new image tag and settings, `helm rollback`, SIGKILL of the agent, one GPU
turning unhealthy. After each, every holder is the same container (no restart, same runtime id), its client
still attached to the same server process (by the pid in its socket credentials), with the same env, mounts
and cgroup limits. A pod admitted before the node side (its own hostPath mount of the pipe directory, no
RuntimeClass) keeps running and reaching the daemon through the upgrade. Runs last in the tier: it replaces
the components the other tests used, then removes them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.mpsdaemon import mpsprep
from app.core import names
from app.kube.calls import MERGE_PATCH, Request
from app.kube.client import Kube
from tests.devcluster import Cluster, kubeletnode, wait_for
from tests.devcluster.identities import GPUPACK_NAMESPACE

from . import chart
from .pods import busybox_pod, env_of, idle_node, new_namespace, run_to_completion

ROLLOUT_TIMEOUT_S = 180
CONFIGMAP_SYNC_TIMEOUT_S = 180  # the kubelet refreshes a ConfigMap volume within its sync period (~1 min)
HOLDERS = ("holder-a", "holder-b")


@pytest.fixture(scope="module")
def kube(real_cluster: tuple[Cluster, kubeletnode.RealNode]) -> Iterator[Kube]:
    k = Kube.connect(str(real_cluster[0].kubeconfig))
    yield k
    k.close()


@dataclass(frozen=True)
class Held:
    """What must not change for a running holder pod, read from the API and from the host's /proc."""

    container_id: str
    restarts: int
    server_pid: int
    client_pid: int
    environ: bytes
    mounts: tuple[str, ...]
    memory_limit: str
    log: str
    allocation: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Holders:
    namespace: str
    before: dict[str, Held]


def _gpupack_image(kube: Kube) -> str:
    (agent,) = chart.pods(kube, "agent")
    image: str = agent["spec"]["containers"][0]["image"]
    return image


def _get_pod(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = kube.send(Request("GET", f"/api/v1/namespaces/{ns}/pods/{name}"))
    return pod


def _pid_of_container(container_id: str) -> int:
    """The host pid of the container's main process, found by its cgroup (cgroupfs: .../<container id>)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if container_id in cgroup and b"client" in cmdline:
            return int(entry.name)
    raise AssertionError(f"no process of container {container_id} on the host")


def _memory_limit(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes").read_text().strip()
    return ""


def _held(kube: Kube, cluster: Cluster, ns: str, name: str) -> Held:
    pod = _get_pod(kube, ns, name)
    (status,) = pod["status"]["containerStatuses"]
    assert status["state"].get("running"), status
    container_id = status["containerID"].removeprefix("containerd://")
    log = kube.text(f"/api/v1/namespaces/{ns}/pods/{name}/log", {"container": "main"})
    words = log.split()
    assert words[:1] == ["server"], log  # `server <pid> uid <uid>`: attached
    server = int(words[1])
    pid = _pid_of_container(container_id)
    clients = chart.mps_control(cluster, f"get_client_list {server}").split()
    assert str(pid) in clients, (pid, clients)  # the daemon knows the client by its host pid
    mounts = tuple(
        sorted(
            " ".join(line.split()[3:5]) for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        )
    )
    annotations = pod["metadata"]["annotations"]
    return Held(
        container_id=container_id,
        restarts=status["restartCount"],
        server_pid=server,
        client_pid=pid,
        environ=Path(f"/proc/{pid}/environ").read_bytes(),
        mounts=mounts,
        memory_limit=_memory_limit(pid),
        log=log,
        allocation=tuple(sorted((k, v) for k, v in annotations.items() if k.startswith(names.DOMAIN))),
    )


@pytest.fixture(scope="module")
def holders(real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube) -> Holders:
    """Two pods, each with a stand-in MPS client that holds its connection; 0.75 each: one per GPU."""
    cluster, node = real_cluster
    idle_node(kube, node.name)
    ns = new_namespace(kube)
    image = _gpupack_image(kube)
    for name in HOLDERS:
        pod = busybox_pod(
            name, {names.GPU_FRACTION: "0.75"}, {"main": (chart.STANDIN_MPS, "client", "--hold")}, node.name
        )
        main = pod["spec"]["containers"][0]
        main["image"] = image  # the test image: it carries the stand-in (and Python)
        main["resources"] = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}
        pod["spec"]["restartPolicy"] = "Always"  # a lost client would show as a restart
        kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", pod))

    def attached() -> bool:
        for name in HOLDERS:
            pod = _get_pod(kube, ns, name)
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if not statuses or not statuses[0]["state"].get("running"):
                return False
            log = kube.text(f"/api/v1/namespaces/{ns}/pods/{name}/log", {"container": "main"})
            if not log.startswith("server "):
                return False
        return True

    wait_for(attached, 120, "both holders attached to an MPS server", interval=1)
    before = {name: _held(kube, cluster, ns, name) for name in HOLDERS}
    gpus = {_get_pod(kube, ns, n)["metadata"]["annotations"][names.ALLOC_GPU_UUIDS] for n in HOLDERS}
    assert len(gpus) == 2, gpus  # one holder per GPU
    return Holders(ns, before)


def _assert_untouched(kube: Kube, cluster: Cluster, holders: Holders) -> None:
    for name, before in holders.before.items():
        after = _held(kube, cluster, holders.namespace, name)
        assert after == before, name
    servers = chart.mps_control(cluster, "get_server_list").split()
    assert servers == [str(holders.before[HOLDERS[0]].server_pid)]  # one multi-user server, the same one


def _daemon_pod(kube: Kube) -> dict[str, Any]:
    (pod,) = chart.pods(kube, "mps-daemon")
    return pod


def _gpunode(kube: Kube, node: str) -> dict[str, Any]:
    path = f"/apis/{names.GPUNODE_GROUP}/{names.GPUNODE_VERSION}/{names.GPUNODE_PLURAL}/{node}"
    obj: dict[str, Any] = kube.send(Request("GET", path))
    return obj


def _mps_running(kube: Kube, node: str) -> bool:
    mps = _gpunode(kube, node).get("status", {}).get("mps", {})
    return mps.get("state") == "running" and mps.get("isolation") == "mps"


def _component_names(kube: Kube) -> set[str]:
    return {p["metadata"]["name"] for c in ("webhook", "extender", "agent") for p in chart.pods(kube, c)}


def _daemon_identity(kube: Kube) -> tuple[str, str, int]:
    pod = _daemon_pod(kube)
    (status,) = pod["status"]["containerStatuses"]
    return pod["metadata"]["uid"], status["containerID"], status["restartCount"]


def test_the_agent_adopts_the_daemon_pod_which_prepared_the_gpus(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, holders: Holders
) -> None:
    cluster, node = real_cluster
    wait_for(lambda: _mps_running(kube, node.name), 60, "GPUNode status.mps running")
    daemon = _daemon_pod(kube)
    assert daemon["spec"]["hostPID"] is True
    assert daemon["spec"]["containers"][0]["command"][:3] == [chart.STANDIN_MPS, "-f", "-M"]
    record = json.loads((chart.mps_pipe_dir(cluster) / mpsprep.READY_FILE).read_text())
    assert record["bootID"] == mpsprep.boot_id()
    uuids = [g["uuid"] for g in _gpunode(kube, node.name)["spec"]["gpus"]]
    # GPU 1 is the chart's agent.mps.timeSliceGpus: left in DEFAULT.
    modes = ["NVML_COMPUTEMODE_EXCLUSIVE_PROCESS", "NVML_COMPUTEMODE_DEFAULT"]
    assert record["gpus"] == dict(zip(uuids, modes, strict=True))
    assert mpsprep.not_ready(chart.mps_pipe_dir(cluster), uuids, None, mpsprep.boot_id()) == ""
    # Different pods, one multi-user server: two clients at once.
    (server,) = {h.server_pid for h in holders.before.values()}
    assert sorted(chart.mps_control(cluster, f"get_client_list {server}").split()) == sorted(
        str(h.client_pid) for h in holders.before.values()
    )


def test_upgrade_rolls_the_components_but_not_the_daemon_and_running_pods_keep_their_gpu(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, helm_bin: str, holders: Holders
) -> None:
    cluster, node = real_cluster
    # A pod as gpupack admitted MPS shares before the node side: the whole pipe dir as a hostPath volume,
    # no RuntimeClass. It must keep running, reaching the daemon, through the rollout (docs/node-side.md).
    # 0.25: it fits beside a 0.75 holder.
    # Its namespace marked as one whose pods may still mount the pipe directory (the chart's mps-pipe-dir
    # policy refuses such a pod created anywhere else).
    legacy_ns = new_namespace(
        kube, {"pod-security.kubernetes.io/enforce": "privileged", "gpupack.io/mps-pipe-dir": "allowed"}
    )
    probe = "while true; do test -S /tmp/nvidia-mps/control && echo reach-$(date +%s); sleep 1; done"
    legacy = busybox_pod("legacy", {names.GPU_FRACTION: "0.25"}, {"main": ("sh", "-c", probe)}, node.name)
    legacy["spec"]["volumes"] = [
        {
            "name": "gpupack-mps-pipe",
            "hostPath": {"path": str(chart.mps_pipe_dir(cluster)), "type": "DirectoryOrCreate"},
        }
    ]
    legacy["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "gpupack-mps-pipe", "mountPath": "/tmp/nvidia-mps"}
    ]
    kube.send(Request("POST", f"/api/v1/namespaces/{legacy_ns}/pods", legacy))
    legacy_path = f"/api/v1/namespaces/{legacy_ns}/pods/legacy"
    wait_for(
        lambda: kube.send(Request("GET", legacy_path))["status"].get("phase") == "Running", 90, "legacy pod"
    )
    stored = kube.send(Request("GET", legacy_path))
    assert "runtimeClassName" not in stored["spec"]  # its own pipe mount is kept: no node side for it
    before, daemon = _component_names(kube), _daemon_identity(kube)
    image = _gpupack_image(kube)
    repository, tag = image.rsplit(":", 1)
    new_tag = f"{tag}-next"
    ctr = ["ctr", "--address", str(node.paths.containerd_socket), "--namespace", kubeletnode.NAMESPACE]
    subprocess.run([*ctr, "images", "tag", "--force", image, f"{repository}:{new_tag}"], check=True)
    debug = [arg for c in ("webhook", "extender", "agent") for arg in ("--set", f"{c}.logLevel=debug")]
    chart.helm(
        helm_bin, cluster, "upgrade", chart.RELEASE, str(chart.CHART), "--reuse-values",
        "--set", f"image.tag={new_tag}", *debug,
    )  # fmt: skip
    wait_for(
        lambda: chart.installed(kube) and not (_component_names(kube) & before),
        ROLLOUT_TIMEOUT_S,
        "every component replaced and Ready",
        interval=1,
    )
    assert _gpupack_image(kube) == f"{repository}:{new_tag}"
    # The daemon's template changed too (image tag), but OnDelete keeps the running pod.
    ds = kube.send(
        Request("GET", f"/apis/apps/v1/namespaces/{GPUPACK_NAMESPACE}/daemonsets/{chart.RELEASE}-mps-daemon")
    )
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == f"{repository}:{new_tag}"
    assert _daemon_identity(kube) == daemon
    _assert_untouched(kube, cluster, holders)
    wait_for(lambda: _mps_running(kube, node.name), 60, "the new agent adopted the daemon")
    assert _gpunode(kube, node.name)["status"]["mps"].get("restarts", 0) == 0
    # Placement still works after the rollout (0.25 fits beside a 0.75 holder).
    ns = new_namespace(kube)
    done = run_to_completion(
        kube, ns, busybox_pod("after", {names.GPU_FRACTION: "0.25"}, {"main": ("env",)}, node.name)
    )
    assert done["status"]["phase"] == "Succeeded", done["status"]
    env = env_of(kube, ns, "after", "main")
    assert env[names.ENV_CUDA_VISIBLE_DEVICES] == done["metadata"]["annotations"][names.ALLOC_GPU_UUIDS]
    assert done["spec"]["runtimeClassName"] == "gpupack"
    # The legacy pod ran through the rollout and still reaches the daemon through its hostPath mount.
    status = kube.send(Request("GET", legacy_path))["status"]
    assert status["phase"] == "Running" and status["containerStatuses"][0]["restartCount"] == 0, status
    seen_before = len(kube.text(f"{legacy_path}/log", {"container": "main"}).split())
    wait_for(
        lambda: len(kube.text(f"{legacy_path}/log", {"container": "main"}).split()) > seen_before,
        10,
        "the legacy pod reaching the daemon after the upgrade",
    )


def test_rollback_rolls_back_and_running_pods_keep_their_gpu(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, helm_bin: str, holders: Holders
) -> None:
    cluster, node = real_cluster
    before, daemon = _component_names(kube), _daemon_identity(kube)
    chart.helm(helm_bin, cluster, "rollback", chart.RELEASE)
    wait_for(
        lambda: chart.installed(kube) and not (_component_names(kube) & before),
        ROLLOUT_TIMEOUT_S,
        "every component rolled back and Ready",
        interval=1,
    )
    assert not _gpupack_image(kube).endswith("-next")
    assert _daemon_identity(kube) == daemon
    _assert_untouched(kube, cluster, holders)
    wait_for(lambda: _mps_running(kube, node.name), 60, "the rolled-back agent adopted the daemon")


def test_sigkill_of_the_agent_interrupts_nothing(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, holders: Holders
) -> None:
    cluster, node = real_cluster
    (agent,) = chart.pods(kube, "agent")
    (status,) = agent["status"]["containerStatuses"]
    restarts = status["restartCount"]
    agent_cid = status["containerID"].removeprefix("containerd://")
    pids = [
        int(e.name)
        for e in Path("/proc").iterdir()
        if e.name.isdigit()
        and agent_cid in _read(e / "cgroup")
        and b"agent\x00run" in _read_bytes(e / "cmdline")
    ]
    assert pids, "the agent's process on the host"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)

    def restarted() -> bool:
        (pod,) = chart.pods(kube, "agent")
        (st,) = pod["status"]["containerStatuses"]
        return st["restartCount"] > restarts and chart.ready(pod)

    wait_for(restarted, ROLLOUT_TIMEOUT_S, "the agent container restarted and Ready", interval=1)
    _assert_untouched(kube, cluster, holders)
    wait_for(lambda: _mps_running(kube, node.name), 60, "the restarted agent adopted the daemon")


def test_an_unhealthy_gpu_tells_only_its_pods_and_stops_nothing(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, holders: Holders
) -> None:
    cluster, node = real_cluster
    ns = holders.namespace
    gone = _get_pod(kube, ns, HOLDERS[1])["metadata"]["annotations"][names.ALLOC_GPU_UUIDS]
    uuids = [g["uuid"] for g in _gpunode(kube, node.name)["spec"]["gpus"]]
    path = f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/configmaps/{chart.RELEASE}-agent-sim"
    sim = yaml.safe_load(kube.send(Request("GET", path))["data"]["gpus.yaml"])
    sim["gpus"][uuids.index(gone)]["lost"] = True  # the simulated GPU falls off the bus
    body = {"data": {"gpus.yaml": yaml.safe_dump(sim)}}
    kube.send(Request("PATCH", path, body, content_type=MERGE_PATCH))

    def told() -> list[dict[str, Any]]:
        items = kube.send(Request("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
        return [e for e in items if e.get("reason") == "GpupackGPUUnhealthy"]

    wait_for(lambda: bool(told()), CONFIGMAP_SYNC_TIMEOUT_S, "a GpupackGPUUnhealthy Event", interval=2)
    events = told()
    assert {e["involvedObject"]["name"] for e in events} == {HOLDERS[1]}  # only the pod on that GPU
    assert gone in events[0]["message"] and "keeps running" in events[0]["message"]
    status = {g["uuid"]: g for g in _gpunode(kube, node.name)["status"]["gpus"]}
    assert status[gone]["healthy"] is False
    assert all(status[u]["healthy"] for u in uuids if u != gone)
    # The daemon was not restarted for it, and both holders (the one on the lost GPU too) still run.
    _assert_untouched(kube, cluster, holders)
    assert _mps_running(kube, node.name)


def test_uninstall_removes_every_object_of_the_chart_and_the_daemon(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, helm_bin: str, holders: Holders
) -> None:
    cluster, node = real_cluster
    handler = node.paths.handler_dir
    guard = handler / "gpupack-runc-guard"  # containerd's default runtime (node preparation: kubeletnode)
    runc = os.readlink(handler / "gpupack-runc-guard.previous")  # the node's previous default runtime
    assert sorted(p.name for p in handler.iterdir()) == [
        "gpupack-runc",
        "gpupack-runc-guard",
        "gpupack-runc-guard.json",
        "gpupack-runc-guard.previous",
        "gpupack-runc.json",
    ]
    assert not guard.is_symlink()  # the guard in its place
    kube.send(Request("DELETE", f"/api/v1/namespaces/{holders.namespace}"))
    # Drain what runs under the handler first (docs/node-side.md, "Uninstall"): it needs the binary to stop.
    under = [
        p["metadata"]
        for p in kube.send(Request("GET", "/api/v1/pods"))["items"]
        if p["spec"].get("runtimeClassName") == "gpupack"
    ]
    for meta in under:
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        kube.send(Request("DELETE", path, {"gracePeriodSeconds": 0}))
    wait_for(
        lambda: (
            not any(
                p["spec"].get("runtimeClassName") for p in kube.send(Request("GET", "/api/v1/pods"))["items"]
            )
        ),
        120,
        "every pod under the runtime handler gone",
    )
    chart.helm(helm_bin, cluster, "uninstall", chart.RELEASE, "--wait", "--timeout", "120s")
    selector = {"labelSelector": f"app.kubernetes.io/instance={chart.RELEASE}"}
    paths = (
        f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/pods",
        f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/services",
        f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/configmaps",
        f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/serviceaccounts",
        f"/apis/apps/v1/namespaces/{GPUPACK_NAMESPACE}/deployments",
        f"/apis/apps/v1/namespaces/{GPUPACK_NAMESPACE}/daemonsets",
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "/apis/node.k8s.io/v1/runtimeclasses",
    )

    def left() -> list[str]:
        return [
            f"{p}/{o['metadata']['name']}"
            for p in paths
            for o in kube.send(Request("GET", p, query=selector))["items"]
        ]

    wait_for(lambda: not left(), 60, "no object of the release left")
    # The node side's installer removed the handler from the node (no container runs under it any more)
    # and put the node's previous default runtime back where containerd's default runtime names it;
    # containerd's declarations are node preparation, not the chart's (docs/node-side.md).
    wait_for(
        lambda: sorted(p.name for p in handler.iterdir()) == ["gpupack-runc-guard"] and guard.is_symlink(),
        60,
        "the handler removed from the node and the previous default runtime back",
    )
    assert os.readlink(guard) == runc == shutil.which("runc")
    # A pod whose env asks for every GPU gets it again: nothing of gpupack is left in the way.
    ns = new_namespace(kube)
    plain = busybox_pod(
        "after-uninstall", {}, {"main": ("sh", "-c", 'tr "\\0" "\\n" < /proc/1/environ; echo')}, node.name
    )  # (not the shell's last command: it would exec tr, and an environ opened before exec reads empty)
    plain["spec"]["containers"][0]["env"] = [{"name": names.ENV_NVIDIA_VISIBLE_DEVICES, "value": "all"}]
    plain["spec"]["nodeName"] = node.name  # no scheduler needed
    done = run_to_completion(kube, ns, plain)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert env_of(kube, ns, "after-uninstall", "main")[names.ENV_NVIDIA_VISIBLE_DEVICES] == "all"
    # No daemon left on the node: no stand-in process, no control socket answering.
    wait_for(lambda: not _standin_processes(), 60, "no MPS daemon process left on the node")
    assert not (chart.mps_pipe_dir(cluster) / "control").exists()
    # Helm keeps CRDs (crds/) on uninstall by design: the GPUNode CRD stays, as the local-cluster docs say.


def _standin_processes() -> list[int]:
    return [
        int(e.name)
        for e in Path("/proc").iterdir()
        if e.name.isdigit() and b"gpupack-standin" in _read_bytes(e / "cmdline")
    ]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
