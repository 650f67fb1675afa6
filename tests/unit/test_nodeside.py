"""agent.nodeside: what each container of a pod gets at the node, or why it is refused (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from agent import nodeside
from app import names
from app.model import Allocation

NODE = "gpu-1"
UID = "0b7e6a3c-1111-2222-3333-444455556666"


def alloc(**kw: Any) -> dict[str, str]:
    a = Allocation(kw.get("node", NODE), gpu_indexes=(1,), gpu_uuids=("GPU-b",), milli=500, memory_mib=20480)
    return a.to_annotations()


def a_pod(annotations: dict[str, str] | None = None, node: str = NODE, **spec: Any) -> dict[str, Any]:
    ann = {names.GPU_FRACTION: "0.5", **alloc(), **(annotations or {})}
    return {
        "metadata": {"uid": UID, "namespace": "team-a", "name": "half", "annotations": ann,
                     "labels": {names.LABEL_MANAGED: "true"}},
        "spec": {"nodeName": node, "containers": [{"name": "main"}, {"name": "side"}], **spec},
    }  # fmt: skip


def ask(container: str = "main", uid: str = UID) -> nodeside.Ask:
    return nodeside.Ask(uid, "team-a", "half", container, "c0ffee")


def test_gpu_container_of_an_mps_share_gets_its_allocation_env_and_its_mps_directory() -> None:
    grant = nodeside.decide(ask(), a_pod(), NODE)
    assert isinstance(grant, nodeside.Grant) and grant.mps
    answer = nodeside.answer(grant, "/tmp/nvidia-mps/pods/" + UID)
    assert answer.allowed
    assert answer.env == {
        names.ENV_NVIDIA_VISIBLE_DEVICES: "GPU-b",
        names.ENV_CUDA_VISIBLE_DEVICES: "GPU-b",
        names.ENV_MPS_THREAD_PERCENTAGE: "50",
        names.ENV_MPS_MEMORY_LIMIT: "0=20480M",
        names.ENV_MEMORY_LIMIT_MIB: "20480",
        names.ENV_MPS_PIPE_DIRECTORY: names.MPS_PIPE_DIRECTORY,
    }
    assert answer.mounts == (nodeside.Mount("/tmp/nvidia-mps/pods/" + UID, names.MPS_PIPE_DIRECTORY),)
    assert "NVIDIA_GPU_MEMORY_LIMIT" in answer.unset and "NVIDIA_GPU_MEMORY_REQUESTS" in answer.unset


def test_share_without_mps_gets_no_mps_env_and_no_mount() -> None:
    grant = nodeside.decide(ask(), a_pod({names.ISOLATION: "none"}), NODE)
    assert isinstance(grant, nodeside.Grant) and not grant.mps
    answer = nodeside.answer(grant, None)
    assert not any(k.startswith("CUDA_MPS_") for k in answer.env)
    assert answer.mounts == ()


def test_other_containers_get_no_gpu() -> None:
    grant = nodeside.decide(ask("side"), a_pod(), NODE)
    assert grant == nodeside.Grant({names.ENV_NVIDIA_VISIBLE_DEVICES: "void"})


@pytest.mark.parametrize(
    ("pod", "node", "said"),
    [
        (None, NODE, "is not in the apiserver (deleted, or recreated under the same name)"),
        (a_pod(node="gpu-2"), NODE, "is bound to node 'gpu-2', not to this node 'gpu-1'"),
        (a_pod({names.ALLOC_GPU_UUIDS: "GPU-b,GPU-c"}), NODE, "cannot be read"),
        (a_pod({names.ALLOC_NODE: "gpu-9"}), NODE, "holds an allocation on node 'gpu-9'"),
        (a_pod({names.ISOLATION: "sometimes"}), NODE, "the GPU request of pod team-a/half"),
    ],
    ids=["gone", "other-node", "allocation-unreadable", "allocation-elsewhere", "invalid-request"],
)
def test_refusals_name_the_pod_and_the_reason(pod: dict[str, Any] | None, node: str, said: str) -> None:
    answer = nodeside.decide(ask(), pod, node)
    assert isinstance(answer, nodeside.Answer) and not answer.allowed
    assert f"pod team-a/half (uid {UID})" in answer.reason
    assert said in answer.reason


def test_a_pod_recreated_under_the_same_name_is_not_the_one_asked_about() -> None:
    answer = nodeside.decide(ask(uid="another-uid"), a_pod(), NODE)
    assert isinstance(answer, nodeside.Answer) and not answer.allowed


def test_a_pod_without_allocation_is_refused() -> None:
    pod = a_pod()
    pod["metadata"]["annotations"] = {names.GPU_FRACTION: "0.5"}
    answer = nodeside.decide(ask(), pod, NODE)
    assert isinstance(answer, nodeside.Answer)
    assert "has no allocation annotations" in answer.reason


def test_a_pod_that_is_no_gpupack_pod_is_refused() -> None:
    plain = {"metadata": {"uid": UID, "namespace": "team-a", "name": "half"}, "spec": {"nodeName": NODE}}
    answer = nodeside.decide(ask(), plain, NODE)
    assert isinstance(answer, nodeside.Answer)
    assert "is no gpupack pod" in answer.reason and "remove spec.runtimeClassName" in answer.reason


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ([], "must be a JSON object, not list"),
        ({"pod_uid": UID}, "namespace must be a non-empty string (got None)"),
        ({"extra": 1}, "unknown field 'extra'"),
    ],
)
def test_malformed_questions_are_named_field_by_field(raw: object, said: str) -> None:
    out = nodeside.parse_ask(raw)
    assert isinstance(out, str) and said in out


def test_a_well_formed_question_parses() -> None:
    raw = {
        "pod_uid": UID,
        "namespace": "team-a",
        "name": "half",
        "container": "main",
        "container_id": "c0ffee",
    }
    assert nodeside.parse_ask(raw) == ask()
