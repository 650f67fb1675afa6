"""Closed by default on a real kubelet + containerd node: on an MPS GPU, a process that is not an MPS client
is refused the GPU before any MPS client has come, while the pod's own MPS client is served.

The node is prepared as the chart ships it (agent.mps.exclusiveProcess and multiUser on: the daemon pod's
init step puts idle MPS GPUs in EXCLUSIVE_PROCESS, the agent starts a server before any client); the
real-node values add only agent.mps.timeSliceGpus [1] (tests/realnode/chart.py). So GPU 0 is `exclusive`,
GPU 1 `shared`.

STAND-INS, no GPU: the MPS daemon is tests/standin/mps_control.py; the CUDA process is
tests/standin/gpu_alloc.py, an MPS client wherever its CUDA_MPS_PIPE_DIRECTORY has a live daemon; its
context is opened by the agent's simulated allocator, which follows the measured compute-mode rows
(docs/node-side.md, "MPS as measured": with EXCLUSIVE_PROCESS and a server running, a plain process gets
CUDA_ERROR_DEVICE_UNAVAILABLE).
"""

from __future__ import annotations

from pathlib import Path

from app.core import names
from app.kube import paths
from app.kube.calls import Request
from app.kube.client import Kube
from tests.devcluster import Cluster, kubeletnode, wait_for

from . import chart
from .pods import RUN_TIMEOUT_S, busybox_pod, idle_node, new_namespace

SOURCE = Path(__file__).resolve().parents[2] / "tests/standin/gpu_alloc.py"
# The container's GPU, allocated by a plain process first (the pipe directory dropped from its env), then by
# an MPS client (the env the node side gave it).
SCRIPT = (
    'G="$CUDA_VISIBLE_DEVICES"; '
    'echo "PLAIN $(unset CUDA_MPS_PIPE_DIRECTORY; python3 /standin/gpu_alloc.py "alloc $G 100")"; '
    'echo "MPS $(python3 /standin/gpu_alloc.py "alloc $G 100")"; '
    "echo DONE; sleep 3600"
)


def mps_clients(cluster: Cluster) -> dict[str, str]:
    """Each server the node's daemon lists, with its clients (as an operator would ask from the host)."""
    servers = chart.mps_control(cluster, "get_server_list").split()
    return {s: chart.mps_control(cluster, f"get_client_list {s}").strip() for s in servers}


def test_a_plain_process_on_an_mps_gpu_is_refused_before_any_mps_client_came(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    cluster, node = real_cluster
    idle_node(kube, node.name)

    def modes() -> list[str]:
        status = kube.send(Request("GET", paths.gpunode(node.name))).get("status") or {}
        return [(g.get("isolation") or {}).get("mpsMode", "") for g in status.get("gpus") or []]

    wait_for(lambda: modes() == ["exclusive", "shared"], 90, "GPU 0 exclusive, GPU 1 shared")
    # The server the agent started, and no MPS client on it yet (the earlier tests' pods are gone).
    wait_for(
        lambda: (listed := mps_clients(cluster)) != {} and not any(listed.values()),
        60,
        "an MPS server with no client",
    )

    ns = new_namespace(kube)
    image = chart.pods(kube, "agent")[0]["spec"]["containers"][0]["image"]  # has python3 for the client
    configmap = {"metadata": {"name": "standin"}, "data": {"gpu_alloc.py": SOURCE.read_text()}}
    kube.send(Request("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap))
    # GPU 1 (time-sliced) taken whole by an `isolation: none` pod: the share can only go to GPU 0.
    whole = busybox_pod(
        "whole", {names.GPU_FRACTION: "1", names.ISOLATION: "none"}, {"main": ("sleep", "3600")}, node.name
    )
    kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", whole))
    wait_for(
        lambda: (
            kube.send(Request("GET", f"/api/v1/namespaces/{ns}/pods/whole"))["status"].get("phase")
            == "Running"
        ),
        RUN_TIMEOUT_S,
        "a pod holding GPU 1 whole",
        interval=0.5,
    )
    share, share_at = run(kube, ns, image, node.name, name="share", asked={names.GPU_FRACTION: "0.5"})
    assert share_at == "0"
    assert share["PLAIN"].startswith("1: refused CUDA_ERROR_DEVICE_UNAVAILABLE"), share
    assert share["MPS"] == "1: ok used=104857600", share  # its MPS client is served
    kube.send(Request("DELETE", f"/api/v1/namespaces/{ns}"))


def run(
    kube: Kube, ns: str, image: str, node: str, *, name: str, asked: dict[str, str]
) -> tuple[dict[str, str], str]:
    """A pod running SCRIPT with `asked` annotations: its `PLAIN`/`MPS` lines, and the GPU index it got."""
    pod = busybox_pod(name, asked, {"main": ("sh", "-c", SCRIPT)}, node)
    pod["spec"]["volumes"] = [{"name": "standin", "configMap": {"name": "standin"}}]
    pod["spec"]["containers"][0] |= {
        "image": image,
        "volumeMounts": [{"name": "standin", "mountPath": "/standin"}],
    }
    kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", pod))
    log = ""

    def done() -> bool:
        nonlocal log
        try:
            log = kube.text(f"/api/v1/namespaces/{ns}/pods/{name}/log", {"container": "main"})
        except Exception:  # not started yet
            return False
        return "DONE" in log

    wait_for(done, RUN_TIMEOUT_S, f"pod {name} through its allocations", interval=1)
    placed = kube.send(Request("GET", f"/api/v1/namespaces/{ns}/pods/{name}"))["metadata"]["annotations"]
    lines = dict(line.split(" ", 1) for line in log.splitlines() if " " in line)
    print(name, placed[names.ALLOC_GPU_INDEXES], lines)
    return lines, placed[names.ALLOC_GPU_INDEXES]
