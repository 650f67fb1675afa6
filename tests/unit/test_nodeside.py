"""agent.runtime.nodeside: what each container of a pod gets at the node, or why it is refused (pure)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.mpsdaemon import mpsprep
from agent.nvml.base import ComputeMode
from agent.runtime import nodeside
from app.core import names, podview
from app.core.model import Allocation

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


def decide(
    a: nodeside.Ask,
    pod: dict[str, Any] | None,
    node: str,
    mps_not_ready: Callable[[Sequence[str]], str] = nodeside.always_ready,
) -> nodeside.Grant | nodeside.Answer:
    """nodeside.decide on the pod as the agent reads it from the apiserver's answer."""
    return nodeside.decide(a, podview.read(pod) if pod is not None else None, node, mps_not_ready)


def ask(container: str = "main", uid: str = UID) -> nodeside.Ask:
    return nodeside.Ask(uid, "team-a", "half", container, "c0ffee")


def test_gpu_container_of_an_mps_share_gets_its_allocation_env_and_its_mps_directory() -> None:
    grant = decide(ask(), a_pod(), NODE)
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


BOOT = "5d1c2e0a-boot"


def ready_record(pipe: Path, boot: str, modes: dict[str, ComputeMode]) -> None:
    """The ready record as the MPS daemon pod's init step writes it (agent.mpsdaemon.mpsprep.write_ready)."""
    gpus = [mpsprep.GpuMode(i, uuid, mode) for i, (uuid, mode) in enumerate(modes.items())]
    mpsprep.write_ready(pipe, gpus, boot)


def readiness(pipe: Path) -> Callable[[Sequence[str]], str]:
    """The agent's check (agent.main.node_server) against the record in `pipe`, on boot BOOT."""
    return mpsprep.readiness(pipe, BOOT)


@pytest.mark.parametrize(
    ("record", "said"),
    [
        (None, "has not prepared this node ("),
        ({"boot": "an-earlier-boot"}, "has not prepared this node since it booted"),
    ],
    ids=["no-record", "record-of-an-earlier-boot"],
)
def test_an_mps_client_is_refused_until_the_daemon_pod_prepared_the_node_on_this_boot(
    tmp_path: Path, record: dict[str, Any] | None, said: str
) -> None:
    if record is not None:
        ready_record(tmp_path, record["boot"], {"GPU-b": ComputeMode.EXCLUSIVE_PROCESS})
    answer = decide(ask(), a_pod(), NODE, readiness(tmp_path))
    assert isinstance(answer, nodeside.Answer) and not answer.allowed
    assert f"container 'main' of pod team-a/half (uid {UID})" in answer.reason
    assert "would be an MPS client too early" in answer.reason and said in answer.reason
    assert str(tmp_path / mpsprep.READY_FILE) in answer.reason


def test_a_record_of_this_boot_lets_the_mps_client_start_and_shares_without_mps_never_wait(
    tmp_path: Path,
) -> None:
    modes = {"GPU-a": ComputeMode.DEFAULT, "GPU-b": ComputeMode.EXCLUSIVE_PROCESS}
    ready_record(tmp_path, BOOT, modes)
    grant = decide(ask(), a_pod(), NODE, readiness(tmp_path))
    assert isinstance(grant, nodeside.Grant) and grant.mps
    # No record at all: a share without MPS and a container without the GPU start regardless.
    empty = tmp_path / "empty"
    plain = decide(ask(), a_pod({names.ISOLATION: "none"}), NODE, readiness(empty))
    assert isinstance(plain, nodeside.Grant) and not plain.mps
    assert isinstance(decide(ask("side"), a_pod(), NODE, readiness(empty)), nodeside.Grant)


def test_an_mps_client_on_a_gpu_busy_when_the_daemon_pod_started_is_not_refused(tmp_path: Path) -> None:
    # The daemon pod's init could not switch GPU-b (busy): the record says DEFAULT. With
    # exclusiveProcess on, the container used to be refused until the GPU went idle, which it never does
    # while its MPS clients run. The mode is now placement's fact (the GPU is reported "shared"): the
    # container starts as an MPS client, as its placement expected.
    ready_record(tmp_path, BOOT, {"GPU-b": ComputeMode.DEFAULT})
    grant = decide(ask(), a_pod(), NODE, readiness(tmp_path))
    assert isinstance(grant, nodeside.Grant) and grant.mps


def test_share_without_mps_gets_no_mps_env_and_no_mount() -> None:
    grant = decide(ask(), a_pod({names.ISOLATION: "none"}), NODE)
    assert isinstance(grant, nodeside.Grant) and not grant.mps
    answer = nodeside.answer(grant, None)
    assert not any(k.startswith("CUDA_MPS_") for k in answer.env)
    assert answer.mounts == ()


def test_other_containers_get_no_gpu() -> None:
    grant = decide(ask("side"), a_pod(), NODE)
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
    answer = decide(ask(), pod, node)
    assert isinstance(answer, nodeside.Answer) and not answer.allowed
    assert f"pod team-a/half (uid {UID})" in answer.reason
    assert said in answer.reason


def test_a_pod_recreated_under_the_same_name_is_not_the_one_asked_about() -> None:
    answer = decide(ask(uid="another-uid"), a_pod(), NODE)
    assert isinstance(answer, nodeside.Answer) and not answer.allowed


def test_a_pod_without_allocation_is_refused() -> None:
    pod = a_pod()
    pod["metadata"]["annotations"] = {names.GPU_FRACTION: "0.5"}
    answer = decide(ask(), pod, NODE)
    assert isinstance(answer, nodeside.Answer)
    assert "has no allocation annotations" in answer.reason


def test_a_pod_that_is_no_gpupack_pod_is_refused() -> None:
    plain = {"metadata": {"uid": UID, "namespace": "team-a", "name": "half"}, "spec": {"nodeName": NODE}}
    answer = decide(ask(), plain, NODE)
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
