"""Pods as KAI-Scheduler's and HAMi's documentation writes them: admitted, scheduled, given the right env.

Each pod is written from the fields their docs show (KAI: the `gpu-fraction` family of annotations and the
NvFractions ones, the `kai.scheduler/queue` label, an init container or a sidecar as the GPU container, a pod
that mounts the host's MPS pipe directory itself; HAMi: `nvidia.com/gpu` with `gpumem`, `gpumem-percentage`,
`gpucores`), with only `schedulerName` left out. The real apiserver calls our webhook (the chart's
configuration, with webhook.hamiTakeover=true), the real kube-scheduler calls our extender, and the env a
kubelet would give each container is resolved from the stored pod. Deliberate differences are refused with
our message (docs/user-guide.md, "Coming from KAI / HAMi").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from kubernetes.client.rest import ApiException

from app.core import catalog, names
from app.core.model import Allocation
from tests.devcluster import wait_for
from webhook import hami

from .conftest import MODEL, REPO, chart_webhook_configuration

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
import test_webhook_pod_validity as validity  # the unit tier's pod generator

QUEUE = {"kai.scheduler/queue": "default-queue"}
PIPE = "/tmp/nvidia-mps"


def kai_pod(name: str, annotations: dict[str, str], **spec: Any) -> dict[str, Any]:
    spec.setdefault("containers", [{"name": "gpu-sharing", "image": "ubuntu", "args": ["sleep", "infinity"]}])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(QUEUE), "annotations": annotations},
        "spec": spec,
    }


def hami_pod(name: str, limits: dict[str, str], **spec: Any) -> dict[str, Any]:
    container = {
        "name": "ubuntu-container",
        "image": "ubuntu:18.04",
        "command": ["bash", "-c", "sleep 86400"],
    }
    spec.setdefault("containers", [{**container, "resources": {"limits": limits}}])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


KAI_MPS_VOLUME = {"name": "nvidia-mps", "hostPath": {"path": PIPE}}
KAI_MPS_MOUNT = {"name": "nvidia-mps", "mountPath": PIPE}

# (pod, GPU container, GPUs, CUDA_MPS_PIPE_DIRECTORY)
KAI_PODS = [
    pytest.param(kai_pod("gpu-sharing", {"gpu-fraction": "0.5"}), "gpu-sharing", 1, PIPE, id="fraction"),
    pytest.param(kai_pod("gpu-memory", {"gpu-memory": "2000"}), "gpu-sharing", 1, PIPE, id="memory-mib"),
    # KAI 0.18's limits beside the request (pkg/common/constants: gpu-fraction.limit, gpu-memory.limit).
    pytest.param(
        kai_pod("gpu-memory-limit", {"gpu-memory": "2000", "gpu-memory.limit": "4000Mi"}),
        "gpu-sharing",
        1,
        PIPE,
        id="memory-limit-0.18",
    ),
    pytest.param(
        kai_pod("gpu-fraction-limit", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.75"}),
        "gpu-sharing",
        1,
        PIPE,
        id="fraction-limit-0.18",
    ),
    pytest.param(
        kai_pod("multi-fraction", {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}),
        "gpu-sharing",
        2,
        PIPE,
        id="fraction-two-devices",
    ),
    pytest.param(
        kai_pod(
            "gpu-init",
            {"gpu-fraction": "0.5", "gpu-fraction-container-name": "gpu-init"},
            initContainers=[{"name": "gpu-init", "image": "ubuntu", "command": ["nvidia-smi"]}],
            containers=[{"name": "main-app", "image": "ubuntu", "args": ["sleep", "infinity"]}],
        ),
        "gpu-init",
        1,
        PIPE,
        id="init-container",
    ),
    pytest.param(
        kai_pod(
            "gpu-sidecar",
            {"gpu-fraction": "0.25", "gpu-fraction-container-name": "gpu-sidecar"},
            initContainers=[{"name": "gpu-sidecar", "image": "ubuntu", "restartPolicy": "Always"}],
            containers=[{"name": "main-app", "image": "ubuntu"}],
        ),
        "gpu-sidecar",
        1,
        PIPE,
        id="sidecar-init-container",
    ),
    pytest.param(
        kai_pod(
            "mps",
            {"gpu-fraction": "0.5", "mps": "true"},
            containers=[{"name": "mps-app", "image": "ubuntu", "volumeMounts": [KAI_MPS_MOUNT]}],
            volumes=[KAI_MPS_VOLUME],
        ),
        "mps-app",
        1,
        PIPE,
        id="mps-pipe-mounted-by-the-user",
    ),
    pytest.param(
        kai_pod(
            "mps-elsewhere",
            {"gpu-fraction": "0.5"},
            containers=[
                {
                    "name": "mps-app",
                    "image": "ubuntu",
                    "volumeMounts": [{"name": "pipes", "mountPath": "/var/run/mps"}],
                }
            ],
            volumes=[{"name": "pipes", "hostPath": {"path": PIPE, "type": "Directory"}}],
        ),
        "mps-app",
        1,
        "/var/run/mps",
        id="mps-pipe-mounted-elsewhere-under-another-name",
    ),
    # KAI's NvFractions examples (docs/gpu-sharing: nv-fractions-memory, nv-fractions-request-limit; the
    # gpu-sharing operator's README) with its compute-mode annotation in both of KAI's spellings.
    pytest.param(
        kai_pod(
            "nv-fractions-memory",
            {"nvidia.com/container.gpu-workload.gpu-memory.request": "7680Mi"},
            containers=[{"name": "gpu-workload", "image": "nvidia/cuda:13.0.2-base-ubi8"}],
        ),
        "gpu-workload",
        1,
        PIPE,
        id="nvfractions-request",
    ),
    pytest.param(
        kai_pod(
            "nv-fractions-request-limit",
            {
                "nvidia.com/container.gpu-workload.gpu-memory.request": "4096Mi",
                "nvidia.com/container.gpu-workload.gpu-memory.limit": "8192Mi",
                "kai.scheduler/gpu-compute-sharing-mode": "time-slicing",
            },
            containers=[{"name": "gpu-workload", "image": "nvidia/cuda:13.0.2-base-ubi8"}],
        ),
        "gpu-workload",
        1,
        PIPE,
        id="nvfractions-request-limit",
    ),
    pytest.param(
        kai_pod(
            "fractional-gpu",
            {
                "nvidia.com/container.trainer.gpu-memory.request": "8Gi",
                "nvidia.com/container.trainer.gpu-memory.limit": "16Gi",
                # sm-sharing would require MPS, which these nodes do not run (--no-mps)
                "nvidia.com/container.trainer.gpu-compute.mode": "time-slicing",
            },
            containers=[{"name": "trainer", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"}],
        ),
        "trainer",
        1,
        PIPE,
        id="nvfractions-operator-readme",
    ),
]


def as_dict(kube: Any, obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = kube.sanitize_for_serialization(obj)
    return out


def kubelet_env(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The env the kubelet gives the container: values, and annotation fieldRefs resolved (missing: "")."""
    annotations = pod["metadata"].get("annotations") or {}
    out: dict[str, str] = {}
    for e in container.get("env") or ():
        if "value" in e:
            out[e["name"]] = e["value"]
        elif "valueFrom" in e:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            key = path.removeprefix("metadata.annotations['").removesuffix("']")
            out[e["name"]] = annotations.get(key, "")
    return out


def scheduled(kube: Any, core: Any, namespace: str, name: str) -> dict[str, Any]:
    def bound() -> dict[str, Any] | None:
        pod = as_dict(kube, core.read_namespaced_pod(name, namespace))
        return pod if pod["spec"].get("nodeName") else None

    pod: dict[str, Any] = wait_for(bound, 60, f"{namespace}/{name} scheduled")
    return pod


def all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod["spec"]["containers"]) + list(pod["spec"].get("initContainers") or [])


@pytest.mark.parametrize(("body", "gpu_container", "devices", "pipe_dir"), KAI_PODS)
def test_kai_pod_is_admitted_scheduled_and_given_its_gpu(  # noqa: PLR0917 (fixtures and parameters)
    gpupack: str,
    kube: Any,
    core: Any,
    namespace: str,
    body: dict[str, Any],
    gpu_container: str,
    devices: int,
    pipe_dir: str,
) -> None:
    core.create_namespaced_pod(namespace, body)
    pod = scheduled(kube, core, namespace, body["metadata"]["name"])
    assert pod["spec"]["nodeName"] == gpupack
    alloc = Allocation.from_annotations(pod["metadata"]["annotations"])
    assert alloc is not None and len(alloc.gpu_uuids) == devices
    # KAI's label and annotations that mean nothing to gpupack are kept as written.
    assert pod["metadata"]["labels"] == {**QUEUE, names.LABEL_MANAGED: "true"}
    for key, value in body["metadata"]["annotations"].items():
        assert pod["metadata"]["annotations"][key] == value
    for container in all_containers(pod):
        env = kubelet_env(pod, container)
        if container["name"] != gpu_container:
            assert env == {names.ENV_NVIDIA_VISIBLE_DEVICES: "void"}, container["name"]
            continue
        assert env[names.ENV_NVIDIA_VISIBLE_DEVICES] == ",".join(alloc.gpu_uuids)
        assert env[names.ENV_CUDA_VISIBLE_DEVICES] == ",".join(alloc.gpu_uuids)
        assert env[names.ENV_MEMORY_LIMIT_MIB] == str(alloc.memory_mib)
        # a burstable pod (an NvFractions limit above its request): its hard limit, also the MPS pinned one
        assert env.get(names.ENV_MEMORY_HARD_LIMIT_MIB) == (
            None if alloc.hard_limit_mib is None else str(alloc.hard_limit_mib)
        )
        assert env[names.ENV_MPS_MEMORY_LIMIT] == ",".join(f"{i}={alloc.cap_mib}M" for i in range(devices))
        assert env[names.ENV_MPS_PIPE_DIRECTORY] == pipe_dir
        assert (
            env[names.ENV_MPS_THREAD_PERCENTAGE]
            == pod["metadata"]["annotations"][names.ALLOC_THREAD_PERCENTAGE]
        )
        # exactly one mount at the pipe dir: the user's where they wrote one, else ours
        assert [m["mountPath"] for m in container["volumeMounts"]].count(pipe_dir) == 1
    # the user's volumes are kept; ours is added only where the pod had no volume of the host's pipe dir
    stored = {v["name"]: v for v in pod["spec"]["volumes"]}
    for volume in body["spec"].get("volumes", []):
        assert stored[volume["name"]]["hostPath"]["path"] == volume["hostPath"]["path"]
    assert len([v for v in stored.values() if v.get("hostPath", {}).get("path") == PIPE]) == 1


HAMI_PODS = [
    pytest.param(
        hami_pod("gpu-pod-mem", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
        {names.GPU_MEMORY: "3000", names.GPU_FRACTION_NUM_DEVICES: "1"},
        id="gpumem",
    ),
    pytest.param(
        hami_pod(
            "gpu-pod-pct",
            {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "30"},
        ),
        {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_NUM_DEVICES: "2"},
        id="gpumem-percentage-and-gpucores",
    ),
]


@pytest.mark.parametrize(("body", "ours"), HAMI_PODS)
def test_hami_pod_is_taken_over_and_scheduled(  # noqa: PLR0917 (fixtures and parameters)
    gpupack: str, kube: Any, core: Any, namespace: str, body: dict[str, Any], ours: dict[str, str]
) -> None:
    core.create_namespaced_pod(namespace, body)
    pod = scheduled(kube, core, namespace, body["metadata"]["name"])
    annotations = pod["metadata"]["annotations"]
    assert {k: annotations[k] for k in ours} == ours
    (container,) = pod["spec"]["containers"]
    assert annotations[names.GPU_FRACTION_CONTAINER_NAME] == container["name"]
    assert not [k for part in container["resources"].values() for k in part if k.startswith("nvidia.com/")]
    alloc = Allocation.from_annotations(annotations)
    assert alloc is not None
    assert kubelet_env(pod, container)[names.ENV_NVIDIA_VISIBLE_DEVICES] == ",".join(alloc.gpu_uuids)
    assert len(alloc.gpu_uuids) == int(ours[names.GPU_FRACTION_NUM_DEVICES])


def test_hami_whole_gpu_pod_is_not_sent_to_gpupack(
    gpupack: str, kube: Any, core: Any, namespace: str
) -> None:
    """nvidia.com/gpu alone is a whole GPU for NVIDIA's device plugin: the matchCondition lets it pass by."""
    body = hami_pod("whole", {"nvidia.com/gpu": "1"})
    created = as_dict(kube, core.create_namespaced_pod(namespace, body, dry_run="All"))
    assert names.LABEL_MANAGED not in (created["metadata"].get("labels") or {})
    assert created["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_hami_share_in_two_containers_is_refused_with_our_message(
    gpupack: str, core: Any, namespace: str
) -> None:
    """A deliberate difference: HAMi shares GPUs per container; gpupack, one container per pod."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}
    body = hami_pod(
        "two",
        limits,
        containers=[
            {"name": "a", "image": "ubuntu", "resources": {"limits": limits}},
            {"name": "b", "image": "ubuntu", "resources": {"limits": limits}},
        ],
    )
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(namespace, body)
    assert "gpupack gives one container per pod a GPU share" in str(err.value.body)
    assert "spec.containers[b].resources" in str(err.value.body)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(obj=validity.pods())
def test_generated_pods_pass_the_real_apiservers_validation_after_our_mutation(
    gpupack: str, core: Any, obj: dict[str, Any]
) -> None:
    """The unit tier's generated pods (arbitrary volumes, mounts, env, init containers and sidecars),
    created with server-side dry run: the apiserver validates what our patch made, or our webhook refused
    naming the clash; never a Kubernetes validation error about something the user did not write."""
    try:
        created = core.create_namespaced_pod("default", obj, dry_run="All")
    except ApiException as exc:
        message = json.loads(exc.body)["message"]
        assert message.startswith('admission webhook "pods.webhook.gpupack.io" denied the request: '), message
        return
    assert (created.metadata.labels or {}).get(names.LABEL_MANAGED) == "true"


def test_chart_hami_clause_is_the_webhooks() -> None:
    """The chart ORs webhook.hami.MATCH_CONDITION into the contract's matchCondition, only when asked."""
    base = yaml.safe_load((REPO / "deploy/webhook/mutatingwebhookconfiguration.yaml").read_text())
    (want,) = base["webhooks"][0]["matchConditions"]
    (on,) = chart_webhook_configuration("webhook.hamiTakeover=true")["webhooks"][0]["matchConditions"]
    (off,) = chart_webhook_configuration()["webhooks"][0]["matchConditions"]
    assert on == {**want, "expression": f"{want['expression']} || {hami.MATCH_CONDITION}"}
    assert off == want


@pytest.mark.parametrize(
    ("annotations", "hard_limit_of"),
    [
        pytest.param({"gpu-memory": "2000", "gpu-memory.limit": "4000Mi"}, lambda mib: 4000, id="gpu-memory"),
        pytest.param(
            {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.75"}, lambda mib: mib * 3 // 4, id="gpu-fraction"
        ),
    ],
)
def test_kai_018_limits_are_the_hard_cap_on_the_gpu_the_pod_lands_on(  # noqa: PLR0917 (fixtures, parameters)
    gpupack: str,
    kube: Any,
    core: Any,
    namespace: str,
    annotations: dict[str, str],
    hard_limit_of: Any,
) -> None:
    """KAI's meaning: gpu-memory.limit is MiB, gpu-fraction.limit a share of the memory of its GPU."""
    core.create_namespaced_pod(namespace, kai_pod("limited", annotations))
    pod = scheduled(kube, core, namespace, "limited")
    alloc = Allocation.from_annotations(pod["metadata"]["annotations"])
    assert alloc is not None and alloc.hard_limit_mib == hard_limit_of(catalog.lookup(MODEL).memory_mib)
