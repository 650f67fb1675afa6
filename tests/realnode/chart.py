"""gpupack installed by its Helm chart into a dev cluster with a real node: the operator guide's install path.

What the dev cluster lacks compared with a full cluster, and how the install makes up for it
(docs/developer/local-cluster.md, "A real node"): no registry (the image is built by deploy/image/build.sh
and imported into the node's containerd, `image.pullPolicy=Never`); no kube-proxy and an apiserver on
127.0.0.1 only (the node's relay at the node IP, chart value `kubernetesAPI`); kube-scheduler runs on the
host (`scheduler.mode=default`, the harness's kube-scheduler already calls the extender at
127.0.0.1:<extender port>, where a relay forwards to the extender Service's ready endpoint, with the
harness's extender certificates in `extender.certs.mode=secret`); no GPUs (`agent.simulated`: a
simulated r615 driver with its state in the cluster directory, and its allocator for containers) and
no NVIDIA MPS binary (the MPS daemon pod runs the
STAND-IN tests/standin/mps_control.py, which the test image carries as
/opt/gpupack-standin/nvidia-cuda-mps-control). Every host path the chart mounts points into the cluster
directory.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.kube.calls import MERGE_PATCH, Request
from app.kube.client import Kube
from tests.devcluster import Cluster, ComponentSpec, kubeletnode, wait_for
from tests.devcluster.addons import SIM_SAMPLES_RELPATH, sim_file_for, wait_for_gpunodes
from tests.devcluster.identities import GPUPACK_NAMESPACE

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy/helm/gpupack"
RELEASE = "gpupack"  # fullname = release name: Services gpupack-webhook, gpupack-extender
GPU_NODE_LABEL = "nvidia.com/gpu.present"  # the chart's default agent nodeSelector
EXTENDER_RELAY = "relay-extender"
STANDIN_MPS = "/opt/gpupack-standin/nvidia-cuda-mps-control"  # in the test image (build.sh --standins)
STANDIN_SOURCE = REPO / "tests/standin/mps_control.py"
SIM_DRIVER = "615.25"  # a simulated driver with MPS v3 and per-cgroup GPU memory limits


def _run(argv: list[str], what: str, timeout_s: float = 600) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout_s)
    if done.returncode != 0:
        pytest.fail(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}", pytrace=False)
    return done.stdout


def helm_binary() -> str:
    return _run([str(REPO / "tests/helm/build.sh")], "tests/helm/build.sh").strip().splitlines()[-1]


def build_image(archive: Path) -> str:
    """deploy/image/build.sh with a docker-archive for containerd and the stand-in MPS control daemon
    (a test build: /opt/gpupack-standin); returns the image reference."""
    argv = ["bash", str(REPO / "deploy/image/build.sh"), "--archive", str(archive), "--standins"]
    out = _run(argv, "deploy/image/build.sh")
    return out.strip().splitlines()[-1]


# A namespace an operator exempted from the guard (nodeSide.guard.exemptNamespaces).
GUARD_EXEMPT_NAMESPACE = "guard-exempt"


def values(cluster: Cluster, node: kubeletnode.RealNode, image: str, model: str, gpus: int) -> dict[str, Any]:
    repository, tag = image.rsplit(":", 1)
    sim = sim_file_for(model, gpus, sorted((REPO / SIM_SAMPLES_RELPATH).glob("*.yaml")), cluster.dir / "sim")
    gpu_set = yaml.safe_load(sim.read_text())
    gpu_set["driver_version"] = SIM_DRIVER  # r615: per-cgroup memory limits available
    tolerate = [{"key": kubeletnode.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "kubernetesAPI": {"host": node.ip, "port": str(cluster.ports.apiserver)},
        "scheduler": {"mode": "default"},
        "webhook": {
            "certs": {"mode": "helm"},
            "mpsPipeHostDir": str(mps_pipe_dir(cluster)),
            "tolerations": tolerate,
        },
        "extender": {"certs": {"mode": "secret"}, "tolerations": tolerate},
        # The node's containerd declares the handler with this BinaryName (kubeletnode, node preparation).
        "nodeSide": {
            "installDir": str(node.paths.handler_dir),
            "stateDir": str(node_side_state_dir(cluster)),
            # The guard is on by default; its default runtime entry is node preparation too (kubeletnode).
            "guard": {"exemptNamespaces": ["gpu-operator", GUARD_EXEMPT_NAMESPACE]},
        },
        "agent": {
            "simulated": yaml.safe_dump(gpu_set, sort_keys=False),
            # The simulated GPUs' allocator, for containers to allocate against their limits (hostPID).
            "simulatedAllocator": {"enabled": True},
            "simulatedStateDir": str(cluster.dir / "sim-driver"),
            "mps": {
                "binary": STANDIN_MPS,  # the stand-in daemon (no GPU, no NVIDIA binary here)
                "pipeDir": str(mps_pipe_dir(cluster)),
                "logDir": str(cluster.dir / "mps-log"),
                # exclusiveProcess and multiUser as shipped (on): MPS GPUs in EXCLUSIVE_PROCESS, a server
                # started before any client. GPU 1 stays in DEFAULT: the node offers both modes (MPS-only
                # GPU 0, time-slicing GPU 1).
                "timeSliceGpus": [1],
            },
            "toolkitConfigDir": str(cluster.dir / "toolkit"),
            "tolerations": [*tolerate, {"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
        },
    }


def mps_pipe_dir(cluster: Cluster) -> Path:
    """The node's MPS pipe directory (agent.mps.pipeDir = webhook.mpsPipeHostDir)."""
    return cluster.dir / "mps-pipe"


def node_side_state_dir(cluster: Cluster) -> Path:
    """nodeSide.stateDir: the agent's socket and the containers' records."""
    return cluster.dir / "node-side"


def mps_control(cluster: Cluster, command: str) -> str:
    """One control command to the node's (stand-in) MPS daemon, sent from the host as an operator would."""
    env = {"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": str(mps_pipe_dir(cluster))}
    argv = [sys.executable, str(STANDIN_SOURCE)]
    done = subprocess.run(
        argv, input=command + "\n", env=env, capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"MPS control {command!r}: exit {done.returncode}: {done.stderr}", pytrace=False)
    return done.stdout


def extender_secret(cluster: Cluster) -> dict[str, Any]:
    """The chart's <fullname>-extender-tls (secret mode) from the harness PKI, which kube-scheduler trusts."""
    pki = cluster.layout.pki

    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {
        "metadata": {"name": f"{RELEASE}-extender-tls"},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": b64(pki.extender.cert),
            "tls.key": b64(pki.extender.key),
            "ca.crt": b64(pki.extender_client_ca.cert),  # --client-ca: the scheduler's client certificate
        },
    }


def prepare(kube: Kube, cluster: Cluster, node: kubeletnode.RealNode, image_archive: Path) -> None:
    kube.send(
        Request(
            "PATCH",
            f"/api/v1/nodes/{node.name}",
            {"metadata": {"labels": {GPU_NODE_LABEL: "true"}}},
            content_type=MERGE_PATCH,
        )
    )
    kubeletnode.import_image(node, image_archive)
    image_archive.unlink()
    kube.send(Request("POST", f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/secrets", extender_secret(cluster)))


def helm(helm_bin: str, cluster: Cluster, *args: str, values_doc: dict[str, Any] | None = None) -> str:
    argv = [helm_bin, *args, "--namespace", GPUPACK_NAMESPACE, "--kubeconfig", str(cluster.kubeconfig)]
    if values_doc is not None:
        path = cluster.dir / "values.yaml"
        path.write_text(yaml.safe_dump(values_doc))
        argv += ["--values", str(path)]
    return _run(argv, f"helm {args[0]}")


def start_extender_relay(cluster: Cluster) -> None:
    service = f"{GPUPACK_NAMESPACE}/{RELEASE}-extender:8888"
    listen = f"127.0.0.1:{cluster.extender_port}"
    argv = (sys.executable, "-m", "tests.devcluster.relay", "--listen", listen, "--service", service)
    cluster.start_process(ComponentSpec(EXTENDER_RELAY, (*argv, "--kubeconfig", str(cluster.kubeconfig))))


def pods(kube: Kube, component: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
    path = f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/pods"
    items: list[dict[str, Any]] = kube.send(Request("GET", path, query={"labelSelector": selector}))["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def installed(kube: Kube) -> bool:
    """Webhook 2/2 Ready, extender 2 running with exactly one Ready (the leader), the agent and the MPS
    daemon Ready."""
    webhook, extender, agent = pods(kube, "webhook"), pods(kube, "extender"), pods(kube, "agent")
    daemon = pods(kube, "mps-daemon")
    return (
        len(webhook) == 2
        and all(ready(p) for p in webhook)
        and len(extender) == 2
        and all(p.get("status", {}).get("phase") == "Running" for p in extender)
        and sum(ready(p) for p in extender) == 1
        and len(agent) == 1
        and ready(agent[0])
        and len(daemon) == 1
        and ready(daemon[0])
    )


def uninstall_if_installed(helm_bin: str, cluster: Cluster) -> None:
    listed = helm(helm_bin, cluster, "list", "--short")
    if RELEASE in listed.split():
        helm(helm_bin, cluster, "uninstall", RELEASE, "--wait", "--timeout", "120s")


INSTALL_TIMEOUT_S = 180


@contextmanager
def real_node_installed(
    cluster_dir: Path,
    bins: Path,
    helm_bin: str,
    *,
    model: str,
    gpus: int,
    on_cluster: Callable[[Cluster | None], None] = lambda c: None,
) -> Iterator[tuple[Cluster, kubeletnode.RealNode]]:
    """The machine's real node taken (waiting for another run's), a control plane, the node, the image built
    and imported, `helm install` of the chart; yields once every component is Ready and the node's GPUNode
    is published. On exit: uninstall (if still installed), the node stopped (RealNodeError naming anything
    left on the machine), the control plane stopped, the machine released. `on_cluster` is told the
    cluster once it runs and None once it stops (the test tier attaches its logs to failures)."""
    lock = kubeletnode.claim_machine(cluster_dir, wait=True)
    cluster = Cluster.prepare(cluster_dir, bins)
    cluster.meta["service_accounts"] = True  # the chart's pods need their ServiceAccount tokens
    node = kubeletnode.RealNode.of(cluster)
    try:
        cluster.start()
        on_cluster(cluster)
        kubeletnode.start(cluster, node)
        t0 = time.monotonic()
        image = build_image(cluster.dir / "gpupack-image.tar")
        kube = Kube.connect(str(cluster.kubeconfig))
        try:
            prepare(kube, cluster, node, cluster.dir / "gpupack-image.tar")
            helm(
                helm_bin,
                cluster,
                "install",
                RELEASE,
                str(CHART),
                values_doc=values(cluster, node, image, model, gpus),
            )
            start_extender_relay(cluster)
            wait_for(lambda: installed(kube), INSTALL_TIMEOUT_S, "chart components Ready", interval=1)
            with cluster.api_client() as api:
                wait_for_gpunodes(api, [node.name], timeout_s=60)
        finally:
            kube.close()
        print(f"\nimage + helm install + Ready: {time.monotonic() - t0:.0f}s", file=sys.stderr)
        yield cluster, node
    finally:
        on_cluster(None)
        try:
            if any(p.name == "kube-apiserver" for p in cluster.processes):
                uninstall_if_installed(helm_bin, cluster)
        finally:
            try:
                kubeletnode.stop(cluster, node)
            finally:
                cluster.stop()
                os.close(lock)
