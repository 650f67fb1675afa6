"""Near-miss annotation keys and ignored GPU keys: the admission warnings, and that they decide nothing."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from app.core import nearmiss, request
from app.core.podview import ContainerView, Kind, PodView
from webhook import mutate
from webhook.metrics import WebhookOutcome
from webhook.schemas import AdmissionReview
from webhook.settings import Settings


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        pytest.param("gpu_fraction", ("gpu-fraction",), id="underscore"),
        pytest.param("GPU-Fraction", ("gpu-fraction",), id="case"),
        pytest.param("gpu-fractions", ("gpu-fraction",), id="plural"),
        pytest.param(
            "gpu-memory-limit", ("gpupack.io/gpu-memory-limit", "gpu-memory.limit"), id="unprefixed"
        ),
        pytest.param("gpupack.io/gpu-fraction", ("gpu-fraction",), id="our-prefix-on-kais-name"),
        pytest.param("gpu-model", ("gpupack.io/gpu-model",), id="model-unprefixed"),
        pytest.param("gpupack.io/isolaton", ("gpupack.io/isolation",), id="one-letter-missing"),
        pytest.param("gpu-fraction-container", ("gpu-fraction-container-name",), id="truncated"),
        pytest.param("gpu-fraction-limit", ("gpu-fraction.limit",), id="kai-limit-dash"),
        pytest.param("nvidia.com/use-gputype", ("gpupack.io/gpu-model",), id="hami-alias"),
        pytest.param(
            "nvidia.com/container.main.gpu-memory.requests",
            ("nvidia.com/container.main.gpu-memory.request",),
            id="nvfractions-field",
        ),
        pytest.param(
            "kai.scheduler/container.main.gpu-memory.portion-limit",
            ("kai.scheduler/container.main.gpu-memory.portion.limit",),
            id="portion-field",
        ),
        pytest.param("nvidia.com/container.main.gpus.devices", (), id="kai-binder-output"),
        pytest.param("gpupack.io/gpu-uuids", (), id="our-allocation"),
        pytest.param("kubectl.kubernetes.io/last-applied-configuration", (), id="unrelated"),
        pytest.param("nvidia.com/gpu.product", (), id="gpu-like-but-far"),
    ],
)
def test_near(key: str, meant: tuple[str, ...]) -> None:
    assert nearmiss.near(key) == meant


def test_a_pod_with_only_a_misspelled_key_hears_the_key_and_that_it_gets_no_share() -> None:
    assert nearmiss.warnings({"gpu_fraction": "0.5", "app": "x"}, asks=False) == (
        "annotation 'gpu_fraction' is not read by gpupack; did you mean 'gpu-fraction'?",
        "gpupack gives this pod no GPU share: none of its GPU annotations ('gpu_fraction') asks for one; "
        "a share is asked with gpu-fraction, gpu-memory or gpupack.io/mig-profile",
    )


def test_a_share_pod_hears_only_near_misses_and_a_plain_pod_nothing() -> None:
    assert nearmiss.warnings({"gpu-fraction": "0.5", "nvidia.com/gpu.product": "A100"}, asks=True) == ()
    assert nearmiss.warnings({"gpu-fraction": "0.5", "gpu-fraction-num-device": "2"}, asks=True) == (
        "annotation 'gpu-fraction-num-device' is not read by gpupack; did you mean "
        "'gpu-fraction-num-devices'?",
    )
    assert nearmiss.warnings({"app": "web"}, asks=False) == ()


def _review(annotations: dict[str, str], namespace: str = "default") -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": namespace, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "cuda"}]},
    }
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": gvk,
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": pod,
        },
    }


def _decide(annotations: dict[str, str]) -> mutate.Decision:
    return mutate.decide(AdmissionReview.model_validate(_review(annotations)), Settings())


@pytest.mark.parametrize("key", ["gpu_fraction", "GPU-Fraction", "gpu-fractions"])
def test_a_near_miss_alone_is_admitted_unmutated_with_the_warning(key: str) -> None:
    decision = _decide({key: "0.5"})
    response = decision.response["response"]
    assert decision.outcome is WebhookOutcome.SKIPPED
    assert response["allowed"] is True and "patch" not in response
    assert f"annotation {key!r} is not read by gpupack; did you mean 'gpu-fraction'?" in response["warnings"]


def test_warnings_do_not_change_a_mutation_or_a_denial() -> None:
    plain = _decide({"gpu-fraction": "0.5"}).response["response"]
    warned = _decide({"gpu-fraction": "0.5", "gpu_memory": "4Gi"}).response["response"]
    assert json.loads(base64.b64decode(warned["patch"])) == json.loads(base64.b64decode(plain["patch"]))
    assert warned["warnings"] == [
        "annotation 'gpu_memory' is not read by gpupack; did you mean 'gpu-memory'?"
    ]
    denied = _decide({"gpu-fraction": "1.5", "gpu-fractions": "0.5"}).response["response"]
    assert denied["allowed"] is False
    assert (
        denied["status"]["message"]
        == "gpu-fraction='1.5': must be a decimal in (0, 1] with at most 2 decimals"
    )
    assert denied["warnings"] == [
        "annotation 'gpu-fractions' is not read by gpupack; did you mean 'gpu-fraction'?"
    ]


def _parse(model: str) -> object:
    main = (ContainerView(Kind.REGULAR, 0, "main"),)
    return request.parse(
        PodView(annotations={"gpu-fraction": "0.5", "gpupack.io/gpu-model": model}, containers=main)
    )


def test_the_model_typo_warning_names_the_closest_known_model() -> None:
    req = _parse("A100-40G|T4")
    assert isinstance(req, request.GpuRequest)
    assert req.models == ("A100-40G", "T4")  # still matched as written: a warning changes nothing
    assert req.warnings == (
        "gpupack.io/gpu-model: 'A100-40G' is no GPU model gpupack knows, so only nodes labelled "
        "gpupack.io/gpu-model=A100-40G match it; did you mean 'A100-40GB'?",
    )
    custom = _parse("my-gpu")
    assert isinstance(custom, request.GpuRequest) and custom.warnings == ()
