"""app.core.managed: the extender's check that a pod carries the webhook's marks (label, allocation env)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from app.core import managed, names, podview
from app.core.errors import RequestError

GOLDEN = Path(__file__).parents[1] / "golden" / "webhook"
# Every pod the webhook mutated in the golden cases, exactly as its patch leaves it.
MUTATED = {
    case.name.removesuffix(".output.json"): out["mutated_object"]
    for case in sorted(GOLDEN.glob("*.output.json"))
    if "mutated_object" in (out := json.loads(case.read_text()))
}

UUIDS_REF = {
    "name": names.ENV_NVIDIA_VISIBLE_DEVICES,
    "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": managed.GPU_UUIDS_FIELD}},
}
VOID = {"name": names.ENV_NVIDIA_VISIBLE_DEVICES, "value": "void"}


def gpu_pod(**spec: Any) -> dict[str, Any]:
    res = {names.RESOURCE_GPU_MILLI: "500"}
    return {
        "metadata": {"name": "p", "labels": {names.LABEL_MANAGED: "true"}},
        "spec": {
            "containers": [
                {"name": "main", "env": [UUIDS_REF], "resources": {"requests": res, "limits": res}}
            ],
            **spec,
        },
    }


def test_golden_cases_include_mutated_pods() -> None:
    assert len(MUTATED) >= 3


@pytest.mark.parametrize("case", sorted(MUTATED))
def test_every_pod_the_webhook_mutates_is_managed(case: str) -> None:
    assert managed.unmanaged_errors(podview.read(MUTATED[case])) == ()
    assert managed.unmanaged_reason(podview.read(MUTATED[case])) is None


def test_a_pod_that_skipped_the_webhook_is_refused_with_every_reason() -> None:
    res = {names.RESOURCE_GPU_MILLI: "600"}
    bare = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": res}}]},
    }
    assert managed.unmanaged_errors(podview.read(bare)) == (
        RequestError(
            "metadata.labels[gpupack.io/managed]",
            "",
            f'must be "true" (set by the gpupack webhook); {managed.FIX}',
        ),
        RequestError(
            "containers[main].env[NVIDIA_VISIBLE_DEVICES]",
            "<unset>",
            f"must be the fieldRef {managed.GPU_UUIDS_FIELD}; {managed.FIX}",
        ),
    )
    reason = managed.unmanaged_reason(podview.read(bare))
    assert reason is not None
    assert reason.startswith("not admitted by the gpupack webhook: metadata.labels[gpupack.io/managed]='': ")


@pytest.mark.parametrize(
    ("edit", "field", "value"),
    [
        pytest.param(
            lambda p: p["metadata"]["labels"].update({names.LABEL_MANAGED: "false"}),
            "metadata.labels[gpupack.io/managed]",
            "false",
            id="label-false",
        ),
        pytest.param(
            lambda p: p["spec"]["containers"][0]["env"].append(
                {"name": names.ENV_NVIDIA_VISIBLE_DEVICES, "value": "all"}
            ),
            "containers[main].env[NVIDIA_VISIBLE_DEVICES]",
            "all",
            id="gpu-container-all-after-ref",
        ),
        pytest.param(
            lambda p: p["spec"]["containers"].append({"name": "side", "image": "cuda"}),
            "containers[side].env[NVIDIA_VISIBLE_DEVICES]",
            "<unset>",
            id="other-container-unset",
        ),
        pytest.param(
            lambda p: p["spec"].update({"initContainers": [{"name": "init", "env": [UUIDS_REF]}]}),
            "initContainers[init].env[NVIDIA_VISIBLE_DEVICES]",
            f"fieldRef {managed.GPU_UUIDS_FIELD}",
            id="init-container-shares-the-gpu",
        ),
        pytest.param(
            lambda p: p["spec"].update(
                {
                    "initContainers": [
                        {
                            "name": "init",
                            "env": [VOID],
                            "resources": {"limits": {names.RESOURCE_GPU_MILLI: "1"}},
                        }
                    ]
                }
            ),
            "initContainers[init].env[NVIDIA_VISIBLE_DEVICES]",
            "void",
            id="init-container-with-our-resource-but-no-gpu-env",
        ),
    ],
)
def test_each_missing_mark_is_named(edit: Any, field: str, value: str) -> None:
    pod = copy.deepcopy(gpu_pod())
    assert managed.unmanaged_errors(podview.read(pod)) == ()
    edit(pod)
    errors = managed.unmanaged_errors(podview.read(pod))
    assert [(e.field, e.value) for e in errors] == [(field, value)]


def test_other_containers_with_void_pass() -> None:
    pod = gpu_pod(initContainers=[{"name": "init", "env": [VOID]}])
    pod["spec"]["containers"].append({"name": "side", "env": [{"name": "X", "value": "1"}, VOID]})
    assert managed.unmanaged_errors(podview.read(pod)) == ()


def test_init_container_with_the_gpu_share_passes() -> None:
    """gpu-fraction-container-name may name an init container: it carries the share and the fieldRef."""
    pod = copy.deepcopy(gpu_pod())
    main = pod["spec"]["containers"][0]
    init = {"name": "gpu-init", "env": main["env"], "resources": main["resources"]}
    pod["spec"]["containers"][0] = {"name": "main-app", "env": [VOID]}
    pod["spec"]["initContainers"] = [init, {"name": "sidecar", "restartPolicy": "Always", "env": [VOID]}]
    assert managed.unmanaged_errors(podview.read(pod)) == ()


def test_share_on_a_container_the_request_does_not_name_is_refused() -> None:
    """Only the GPU container carries our resource: one elsewhere would be charged twice at node level."""
    pod = copy.deepcopy(gpu_pod())
    main = pod["spec"]["containers"][0]
    pod["metadata"]["annotations"] = {
        names.GPU_FRACTION: "0.5",
        names.GPU_FRACTION_CONTAINER_NAME: "gpu-init",
    }
    pod["spec"]["initContainers"] = [{"name": "gpu-init", "env": main["env"], "resources": main["resources"]}]
    errors = managed.unmanaged_errors(podview.read(pod))
    assert [(e.field, e.value) for e in errors] == [("containers[main].resources", names.RESOURCE_GPU_MILLI)]
    assert "only the GPU container ('gpu-init') carries a gpupack share" in errors[0].rule
    pod["spec"]["containers"][0] = {"name": "main", "env": [VOID]}
    assert managed.unmanaged_errors(podview.read(pod)) == ()
