"""The kubelet resolves a gpupack pod's env from the allocation annotations written before the Binding."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app import names
from app.devcluster import Cluster, kubeletnode
from app.kube.client import Kube

from .pods import busybox_pod, env_of, new_namespace, run_to_completion

PROBE = "gpupack-realnode-probe"
# The GPU container prints its env, then a file the test put in the node's MPS pipe dir: the mount works.
MAIN = ("sh", "-c", f'env; echo "PROBE=$(cat "$CUDA_MPS_PIPE_DIRECTORY/{PROBE}")"')
SIDE = ("env",)


@pytest.fixture
def kube(real_cluster: tuple[Cluster, kubeletnode.RealNode]) -> Iterator[Kube]:
    k = Kube.connect(str(real_cluster[0].kubeconfig))
    yield k
    k.close()


@pytest.fixture
def probe(real_cluster: tuple[Cluster, kubeletnode.RealNode]) -> str:
    """A file in the host dir the webhook mounts as the MPS pipe dir; its content is unique to this run."""
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
    assert main["PROBE"] == probe
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
