"""The kubelet resolves a gpupack pod's env from the allocation annotations written before the Binding."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.core import names
from app.kube.calls import Request
from app.kube.client import Kube
from tests.devcluster import Cluster, kubeletnode, wait_for

from . import chart
from .pods import busybox_pod, env_of, new_namespace, run_to_completion

PROBE = "gpupack-realnode-probe"
# The GPU container prints its env, then what its MPS directory holds: the pod's own directory (the daemon's
# socket only), never the node's pipe dir, where the test put a file no tenant may see.
MAIN = ("sh", "-c", 'env; echo "MPSDIR=$(ls -A "$CUDA_MPS_PIPE_DIRECTORY" | tr "\\n" " ")"')
SIDE = ("env",)
ENV_CHECK_TIMEOUT_S = 60  # the chart's agent samples every 5 s


@pytest.fixture
def probe(real_cluster: tuple[Cluster, kubeletnode.RealNode]) -> str:
    """A file in the node's MPS pipe dir (in no pod's own directory); its content is unique to this run."""
    pipe = real_cluster[0].dir / "mps-pipe"
    pipe.mkdir(exist_ok=True)
    token = f"from-the-host-{real_cluster[1].name}"
    (pipe / PROBE).write_text(token + "\n")
    return token


def test_half_gpu_pod_gets_its_gpu_and_limits_from_the_kubelet(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, probe: str
) -> None:
    node = real_cluster[1].name
    ns = new_namespace(kube)
    pod = busybox_pod("half", {names.GPU_FRACTION: "0.5"}, {"main": MAIN, "side": SIDE}, node)
    done = run_to_completion(kube, ns, pod)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["spec"]["nodeName"] == node
    alloc = done["metadata"]["annotations"]
    uuid = alloc[names.ALLOC_GPU_UUIDS]
    assert uuid.startswith("GPU-") and "," not in uuid
    main = env_of(kube, ns, "half", "main")
    assert main[names.ENV_NVIDIA_VISIBLE_DEVICES] == uuid
    assert main[names.ENV_CUDA_VISIBLE_DEVICES] == uuid
    assert main[names.ENV_MPS_THREAD_PERCENTAGE] == alloc[names.ALLOC_THREAD_PERCENTAGE] == "50"
    assert main[names.ENV_MPS_MEMORY_LIMIT] == alloc[names.ALLOC_MPS_MEMORY_LIMIT] == "0=20480M"
    assert main[names.ENV_MEMORY_LIMIT_MIB] == alloc[names.ALLOC_MEMORY_LIMIT_MIB] == "20480"
    assert main[names.ENV_MPS_PIPE_DIRECTORY] == names.MPS_PIPE_DIRECTORY
    assert main["MPSDIR"].split() == ["control"]  # its own directory: not the probe in the pipe dir
    side = env_of(kube, ns, "half", "side")
    assert side[names.ENV_NVIDIA_VISIBLE_DEVICES] == "void"
    assert not {names.ENV_CUDA_VISIBLE_DEVICES, names.ENV_MPS_THREAD_PERCENTAGE} & side.keys()


def test_two_device_pod_gets_both_uuids(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, probe: str
) -> None:
    node = real_cluster[1].name
    ns = new_namespace(kube)
    annotations = {names.GPU_FRACTION: "0.25", names.GPU_FRACTION_NUM_DEVICES: "2"}
    done = run_to_completion(kube, ns, busybox_pod("two", annotations, {"main": MAIN}, node))
    assert done["status"]["phase"] == "Succeeded", done["status"]
    alloc = done["metadata"]["annotations"]
    uuids = alloc[names.ALLOC_GPU_UUIDS].split(",")
    assert len(set(uuids)) == 2
    main = env_of(kube, ns, "two", "main")
    assert main[names.ENV_NVIDIA_VISIBLE_DEVICES].split(",") == uuids
    assert main[names.ENV_CUDA_VISIBLE_DEVICES].split(",") == uuids
    assert main[names.ENV_MPS_MEMORY_LIMIT] == alloc[names.ALLOC_MPS_MEMORY_LIMIT] == "0=10240M,1=10240M"
    assert main[names.ENV_MPS_THREAD_PERCENTAGE] == "25"


def test_agent_checks_each_container_start_and_flags_an_overridden_env(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    """The chart's agent reads each new process's env on the host (/proc/<pid>/environ): the kubelet's
    passes; a process started with CUDA_VISIBLE_DEVICES of its own gets a GpupackEnvMismatch Event."""
    node = real_cluster[1].name
    ns = new_namespace(kube)
    steady = busybox_pod("steady", {names.GPU_FRACTION: "0.25"}, {"main": ("sleep", "600")}, node)
    # The child `sleep` inherits the exported value; the shell itself keeps the kubelet's env.
    override = "export CUDA_VISIBLE_DEVICES=GPU-not-mine; sleep 600; true"
    tampered = busybox_pod("tampered", {names.GPU_FRACTION: "0.25"}, {"main": ("sh", "-c", override)}, node)
    ok_before = agent_checks(kube, "ok")
    for pod in (steady, tampered):
        kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", pod))
    wait_for(lambda: mismatch_events(kube, ns), ENV_CHECK_TIMEOUT_S, "the agent's GpupackEnvMismatch Event")
    (event,) = mismatch_events(kube, ns)
    assert event["involvedObject"]["name"] == "tampered"
    assert "CUDA_VISIBLE_DEVICES='GPU-not-mine' (allocation: 'GPU-" in event["message"]
    assert event["source"]["component"] == "gpupack-agent"
    # steady's processes (and tampered's shell) were checked too, and passed.
    assert agent_checks(kube, "ok") >= ok_before + 2


def mismatch_events(kube: Kube, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.send(Request("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
    return [e for e in items if e.get("reason") == "GpupackEnvMismatch"]


def agent_checks(kube: Kube, result: str) -> float:
    """gpupack_agent_env_checks_total{result} from the agent pod's /metrics (its IP is on the bridge)."""
    (agent,) = chart.pods(kube, "agent")
    url = f"http://{agent['status']['podIP']}:9400/metrics"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpupack_agent_env_checks_total" and sample.labels.get("result") == result:
                return float(sample.value)
    return 0.0
