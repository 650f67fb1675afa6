"""What the webhook writes for an MPS share's pipe directory with gpupack's RuntimeClass (webhook.pipe
output side, webhook.podsecurity), against the legacy hostPath volume it writes without one."""

from __future__ import annotations

from typing import Any

import pytest
from test_webhook_mutate import apply_patch, as_apiserver_stores, decide, decoded, pod, review_of

from app.core import names
from webhook.metrics import WebhookOutcome
from webhook.settings import Settings

NODE_SIDE = Settings(runtime_class="gpupack")
KAI_VOLUME = {"name": "mps", "hostPath": {"path": "/tmp/nvidia-mps"}}
KAI_MOUNT = {"name": "mps", "mountPath": "/mps"}


def mutated(obj: dict[str, Any], settings: Settings, level: str | None = None) -> dict[str, Any]:
    decision = decide(review_of(obj), settings, level)
    assert decision.outcome is WebhookOutcome.MUTATED, decision.messages
    return apply_patch(obj, decoded(decision.response))


def host_paths(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in obj["spec"].get("volumes") or () if "hostPath" in v]


def test_mps_share_gets_the_runtime_class_and_no_host_path() -> None:
    out = mutated(pod({names.GPU_FRACTION: "0.5"}), NODE_SIDE)
    assert out["spec"]["runtimeClassName"] == "gpupack"
    assert host_paths(out) == []
    main = out["spec"]["containers"][0]
    assert "volumeMounts" not in main
    env = {e["name"]: e for e in main["env"]}
    # Where the handler mounts the pod's own MPS directory; the kubelet still resolves the allocation env.
    assert env[names.ENV_MPS_PIPE_DIRECTORY]["value"] == names.MPS_PIPE_DIRECTORY
    assert "fieldRef" in env[names.ENV_MPS_THREAD_PERCENTAGE]["valueFrom"]


def test_without_the_runtime_class_the_legacy_host_path_stays() -> None:
    out = mutated(pod({names.GPU_FRACTION: "0.5"}), Settings())
    assert "runtimeClassName" not in out["spec"]
    assert [v["hostPath"]["path"] for v in host_paths(out)] == [names.MPS_PIPE_DIRECTORY]


def test_share_without_mps_gets_no_runtime_class() -> None:
    out = mutated(pod({names.GPU_FRACTION: "0.5", names.ISOLATION: "none"}), NODE_SIDE)
    assert "runtimeClassName" not in out["spec"]
    assert host_paths(out) == []


def test_a_pod_mounting_the_pipe_dir_itself_keeps_its_mount_and_gets_no_runtime_class() -> None:
    obj = pod(
        {names.GPU_FRACTION: "0.5"}, {"name": "main", "volumeMounts": [KAI_MOUNT]}, volumes=[KAI_VOLUME]
    )
    out = mutated(obj, NODE_SIDE)
    assert "runtimeClassName" not in out["spec"]
    assert out["spec"]["volumes"] == [KAI_VOLUME]
    env = {e["name"]: e for e in out["spec"]["containers"][0]["env"]}
    assert env[names.ENV_MPS_PIPE_DIRECTORY]["value"] == "/mps"


def test_a_runtime_class_of_the_pods_own_is_refused_naming_the_field() -> None:
    obj = pod({names.GPU_FRACTION: "0.5"}, runtimeClassName="nvidia")
    decision = decide(review_of(obj), NODE_SIDE)
    assert decision.outcome is WebhookOutcome.DENIED
    (message,) = decision.messages
    assert message.startswith("spec.runtimeClassName='nvidia': must be 'gpupack' or unset for an MPS share")


def test_our_runtime_class_already_set_is_no_clash_and_no_op() -> None:
    out = mutated(pod({names.GPU_FRACTION: "0.5"}), NODE_SIDE)
    again = decide(review_of(as_apiserver_stores(out)), NODE_SIDE)
    assert decoded(again.response) == []
    # isolation none leaves a user's runtime class alone
    plain = pod({names.GPU_FRACTION: "0.5", names.ISOLATION: "none"}, runtimeClassName="nvidia")
    assert mutated(plain, NODE_SIDE)["spec"]["runtimeClassName"] == "nvidia"


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_mps_share_is_admitted_where_host_path_is_forbidden_with_the_runtime_class(level: str) -> None:
    out = mutated(pod({names.GPU_FRACTION: "0.5"}), NODE_SIDE, level)
    assert out["spec"]["runtimeClassName"] == "gpupack"


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_legacy_mps_share_is_refused_where_host_path_is_forbidden(level: str) -> None:
    decision = decide(review_of(pod({names.GPU_FRACTION: "0.5"})), Settings(), level)
    assert decision.outcome is WebhookOutcome.DENIED
    (message,) = decision.messages
    assert f"Pod Security level {level!r} enforced in namespace 'default' refuses" in message
    assert "nodeSide.enabled" in message


def test_own_pipe_mount_is_refused_at_baseline_with_what_to_remove() -> None:
    obj = pod(
        {names.GPU_FRACTION: "0.5"}, {"name": "main", "volumeMounts": [KAI_MOUNT]}, volumes=[KAI_VOLUME]
    )
    decision = decide(review_of(obj), NODE_SIDE, "baseline")
    assert decision.outcome is WebhookOutcome.DENIED
    (message,) = decision.messages
    assert "the pod mounts the node's MPS pipe directory itself (a hostPath volume, at /mps)" in message
    assert "remove that volume and its mount" in message


def test_runtime_class_setting_must_be_a_name() -> None:
    (error,) = Settings(runtime_class="Not A Name").validate()
    assert "runtime_class" in str(error) or "runtime-class" in str(error)
