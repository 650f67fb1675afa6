"""HAMi takeover: pods asking for nvidia.com/gpumem / gpumem-percentage / gpucores become gpupack shares."""

from __future__ import annotations

from typing import Any

import pytest
from test_webhook_mutate import apply_patch, decide, decoded, review_of
from test_webhook_pod_validity import apiserver_errors

from app.core import managed, names, podview
from webhook import mutate
from webhook.metrics import WebhookOutcome
from webhook.settings import Settings

ON = Settings(hami_takeover=True)


def hami_pod(limits: dict[str, str], *, init: bool = False, **meta: Any) -> dict[str, Any]:
    gpu = {"name": "cuda", "image": "cuda", "resources": {"limits": limits}}
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "x"}]}
    if init:
        spec["initContainers"] = [gpu]
    else:
        spec["containers"].insert(0, gpu)
    return {"metadata": {"name": "p", **meta}, "spec": spec}


@pytest.mark.parametrize(
    ("limits", "ours", "dropped"),
    [
        pytest.param(
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"},
            {"gpu-memory": "3000", "gpu-fraction-num-devices": "1"},
            [],
            id="gpumem",
        ),
        pytest.param(
            {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "30"},
            {"gpu-fraction": "0.3", "gpu-fraction-num-devices": "2"},
            [],
            id="gpumem-percentage",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3k"},
            {"gpu-memory": "3000", "gpu-fraction-num-devices": "1"},
            [],
            id="gpumem-as-the-apiserver-stores-it",
        ),
        pytest.param(
            {"nvidia.com/gpucores": "100"},
            {"gpu-fraction": "1", "gpu-fraction-num-devices": "1"},
            [],
            id="gpucores-alone-defaults-to-one-gpu",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"},
            {"gpu-memory": "3000", "gpu-fraction-num-devices": "1"},
            ["nvidia.com/gpucores=30 is not carried over"],
            id="gpumem-wins-over-gpucores",
        ),
    ],
)
def test_takeover_rewrites_hami_resources(
    limits: dict[str, str], ours: dict[str, str], dropped: list[str]
) -> None:
    obj = hami_pod(limits, annotations={"nvidia.com/use-gputype": "A100"})
    decision = decide(review_of(obj), ON)
    assert decision.outcome is WebhookOutcome.MUTATED, decision.messages
    out = apply_patch(obj, decoded(decision.response))
    assert apiserver_errors(out) == [] and managed.unmanaged_errors(podview.read(out)) == ()
    ann = out["metadata"]["annotations"]
    assert {k: ann.get(k) for k in ours} == ours
    assert ann[names.GPU_FRACTION_CONTAINER_NAME] == "cuda"
    assert ann["nvidia.com/use-gputype"] == "A100"  # HAMi's other annotations are left alone
    res = out["spec"]["containers"][0]["resources"]
    assert not [k for part in res.values() for k in part if k.startswith("nvidia.com/")]
    assert decision.messages[0].startswith("HAMi resources of spec.containers[cuda] (")
    for text in dropped:
        assert any(text in m for m in decision.messages)
    assert decoded(mutate.review(review_of(out), ON)) == []  # a reinvocation finds a gpupack pod


def test_takeover_of_an_init_container() -> None:
    obj = hami_pod({"nvidia.com/gpumem": "2048"}, init=True)
    out = apply_patch(obj, decoded(mutate.review(review_of(obj), ON)))
    init = out["spec"]["initContainers"][0]
    assert init["resources"]["limits"] == {
        names.RESOURCE_GPU_MEMORY_MIB: "2048",
        names.RESOURCE_QUOTA_GPU_MILLI: "136",  # 2048 MiB of a T4's 15109, rounded up
        names.RESOURCE_QUOTA_GPU_MEMORY_MIB: "2048",
    }
    assert out["spec"]["containers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def test_off_by_default() -> None:
    obj = hami_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
    decision = decide(review_of(obj), Settings())
    assert decision.outcome is WebhookOutcome.SKIPPED and "patch" not in decision.response["response"]


def test_whole_gpu_pod_is_not_taken_over() -> None:
    obj = hami_pod({"nvidia.com/gpu": "1"})
    assert decide(review_of(obj), ON).outcome is WebhookOutcome.SKIPPED


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        pytest.param(
            {"nvidia.com/gpumem-percentage": "150"},
            "spec.containers[cuda].resources[nvidia.com/gpumem-percentage]='150': "
            "must be an integer percentage from 1 to 100",
            id="percentage-over-100",
        ),
        pytest.param(
            {"nvidia.com/gpumem": "3Gi"},
            "spec.containers[cuda].resources[nvidia.com/gpumem]='3Gi': "
            "must be a whole number of MiB per GPU, e.g. 4096",
            id="gpumem-with-suffix",
        ),
        pytest.param(
            {"nvidia.com/gpu": "0", "nvidia.com/gpucores": "20"},
            "spec.containers[cuda].resources[nvidia.com/gpu]='0': must be an integer from 1 to 16",
            id="zero-gpus",
        ),
    ],
)
def test_bad_hami_values_are_refused_naming_the_resource(limits: dict[str, str], message: str) -> None:
    decision = decide(review_of(hami_pod(limits)), ON)
    assert decision.outcome is WebhookOutcome.DENIED
    assert decision.messages == (message,)


def test_two_containers_with_hami_shares_are_refused() -> None:
    obj = hami_pod({"nvidia.com/gpumem": "1000"})
    obj["spec"]["containers"][1]["resources"] = {"limits": {"nvidia.com/gpucores": "50"}}
    decision = decide(review_of(obj), ON)
    assert decision.outcome is WebhookOutcome.DENIED
    assert decision.messages == (
        "spec.containers[app].resources='nvidia.com/gpucores': gpupack gives one container per pod a GPU "
        "share; HAMi resources are requested by spec.containers[cuda], spec.containers[app]",
    )


def test_pod_with_our_annotation_is_not_rewritten() -> None:
    """Our annotation wins: HAMi resources beside it are the user's to fix (nvidia.com/gpu conflicts)."""
    obj = hami_pod(
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}, annotations={names.GPU_FRACTION: "0.5"}
    )
    decision = decide(review_of(obj), ON)
    assert decision.outcome is WebhookOutcome.DENIED
    assert "must not be combined with nvidia.com/gpu" in decision.messages[0]
