"""The webhook keeps one patch per kind of pod (mutate.patch_key): a pod that differs from one already seen in
any single input the patch reads gets its own patch, the one a first review of it gets."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from app.core import names, podview, request
from app.core.quota import Fleet
from webhook import mutate
from webhook.schemas import AdmissionReview
from webhook.settings import Settings

LEGACY = Settings()  # MPS pipe as a hostPath volume and mount
RUNTIME_CLASS = Settings(runtime_class="gpupack")
SCHEDULER = Settings(scheduler_name="gpupack-scheduler")


def _pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "labels": {"app": "train"}, "annotations": {names.GPU_FRACTION: "0.5"}},
        "spec": {
            "containers": [
                {"name": "main", "image": "cuda"},
                {"name": "side", "image": "busybox"},
            ],
            "initContainers": [{"name": "fetch", "image": "busybox"}],
        },
    }


def _review(pod: dict[str, Any]) -> AdmissionReview:
    return AdmissionReview.model_validate(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": "default",
                "object": pod,
            },
        }
    )


def _answer(pod: dict[str, Any], settings: Settings, fleet: Fleet) -> Any:
    """What the webhook answers: the patch ops, or the denial's message."""
    response = mutate.decide(_review(pod), settings, None, fleet).response["response"]
    if not response["allowed"]:
        return response["status"]["message"]
    return json.loads(base64.b64decode(response["patch"])) if "patch" in response else []


def _first_answer(pod: dict[str, Any], settings: Settings, fleet: Fleet) -> Any:
    """What a first review of `pod` gets: its patch worked out from the pod, with no table."""
    mutate.forget_kinds()
    view = podview.read(pod)
    parsed = request.parse(view)
    assert isinstance(parsed, request.GpuRequest)
    ops = mutate.changes(view, parsed, mutate.pipe_plans(view, parsed, settings), settings, fleet)
    mutate.forget_kinds()
    return "; ".join(map(str, ops)) if isinstance(ops, tuple) else ops


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = pod["spec"]["containers"]
    return out


def _gpu(pod: dict[str, Any]) -> dict[str, Any]:
    return _containers(pod)[0]


def _set(
    where: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any
) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        where(pod)[key] = value

    return change


def _meta(pod: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = pod["metadata"]
    return out


def _spec(pod: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = pod["spec"]
    return out


def _side(pod: dict[str, Any]) -> dict[str, Any]:
    return _containers(pod)[1]


def _annotate(key: str, value: str) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        _meta(pod)["annotations"][key] = value

    return change


def _ask(key: str, value: str) -> Callable[[dict[str, Any]], None]:
    """The GPU share asked as `key` instead of gpu-fraction."""

    def change(pod: dict[str, Any]) -> None:
        annotations = _meta(pod)["annotations"]
        del annotations[names.GPU_FRACTION]
        annotations[key] = value

    return change


def _swap_containers(pod: dict[str, Any]) -> None:
    _containers(pod).reverse()
    _meta(pod)["annotations"][names.GPU_FRACTION_CONTAINER_NAME] = "main"


def _gpu_as_init(pod: dict[str, Any]) -> None:
    _spec(pod)["initContainers"].insert(0, {"name": "warm", "image": "busybox"})
    _meta(pod)["annotations"][names.GPU_FRACTION_CONTAINER_NAME] = "warm"


OUR_TERM = {"key": names.NODE_LABEL_ENABLED, "operator": "In", "values": ["true"]}
ZONE_TERM = {"key": "zone", "operator": "In", "values": ["a"]}


def _affinity(*expressions: dict[str, Any]) -> dict[str, Any]:
    terms = [{"matchExpressions": list(expressions)}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def _no_change(pod: dict[str, Any]) -> None:
    pass


NO_GPU = {"name": names.ENV_NVIDIA_VISIBLE_DEVICES, "value": names.NO_GPU}
SMALL = Fleet(models={"T4": 15360})

# (id, settings, fleet, the one change to the pod, or none: then the settings or fleet are the change); each
# changes what the patch must say.
CHANGES: list[tuple[str, Settings, Fleet, Callable[[dict[str, Any]], None]]] = [
    ("no labels", LEGACY, Fleet(), _set(_meta, "labels", {})),
    ("our label already set", LEGACY, Fleet(), _set(_meta, "labels", {names.LABEL_MANAGED: "true"})),
    ("an autoscaler annotation set", LEGACY, Fleet(), _annotate("karpenter.sh/do-not-disrupt", "false")),
    ("another fraction", LEGACY, Fleet(), _annotate(names.GPU_FRACTION, "0.25")),
    ("two devices", LEGACY, Fleet(), _annotate(names.GPU_FRACTION_NUM_DEVICES, "2")),
    ("a GPU model", LEGACY, Fleet(), _annotate(names.GPU_MODEL, "A100-40GB")),
    ("memory, not a fraction", LEGACY, Fleet(), _ask(names.GPU_MEMORY, "4Gi")),
    ("a MIG device, not a fraction", LEGACY, Fleet(), _ask(names.MIG_PROFILE, "1g.10gb")),
    ("another GPU container", LEGACY, Fleet(), _annotate(names.GPU_FRACTION_CONTAINER_NAME, "side")),
    ("the GPU container an init container", LEGACY, Fleet(), _gpu_as_init),
    ("the GPU container second", LEGACY, Fleet(), _swap_containers),
    ("GPU container env of its own", LEGACY, Fleet(), _set(_gpu, "env", [{"name": "EPOCHS", "value": "1"}])),
    (
        "GPU container env we set, as we set it",
        LEGACY,
        Fleet(),
        _set(_gpu, "env", [{"name": names.ENV_MEMORY_LIMIT_MIB, "value": "9"}]),
    ),
    (
        "GPU container env we set, of its own",
        LEGACY,
        Fleet(),
        _set(_gpu, "env", [{"name": names.ENV_CUDA_VISIBLE_DEVICES, "value": "0"}]),
    ),
    (
        "GPU container env we set, as a number",
        LEGACY,
        Fleet(),
        _set(_gpu, "env", [{"name": names.ENV_CUDA_VISIBLE_DEVICES, "value": 0}]),
    ),
    ("other container env of its own", LEGACY, Fleet(), _set(_side, "env", [{"name": "A", "value": "1"}])),
    ("other container without a GPU already", LEGACY, Fleet(), _set(_side, "env", [NO_GPU])),
    (
        "other container with all GPUs",
        LEGACY,
        Fleet(),
        _set(_side, "env", [{"name": names.ENV_NVIDIA_VISIBLE_DEVICES, "value": "all"}]),
    ),
    ("GPU container resources", LEGACY, Fleet(), _set(_gpu, "resources", {"requests": {"cpu": "1"}})),
    ("GPU container empty limits", LEGACY, Fleet(), _set(_gpu, "resources", {"limits": {}})),
    (
        "GPU container with our resource at another amount",
        LEGACY,
        Fleet(),
        _set(_gpu, "resources", {"limits": {names.RESOURCE_GPU_MILLI: "100"}}),
    ),
    (
        "GPU container with our resource as a number",
        LEGACY,
        Fleet(),
        _set(_gpu, "resources", {"limits": {names.RESOURCE_GPU_MILLI: 500}, "requests": {}}),
    ),
    (
        "GPU container with a stale resource of ours",
        LEGACY,
        Fleet(),
        _set(_gpu, "resources", {"requests": {names.RESOURCE_GPU_MEMORY_MIB: "1024"}}),
    ),
    (
        "GPU container mounting another volume at the pipe dir",
        LEGACY,
        Fleet(),
        _set(_gpu, "volumeMounts", [{"name": "data", "mountPath": names.MPS_PIPE_DIRECTORY}]),
    ),
    (
        "GPU container mounting something elsewhere",
        LEGACY,
        Fleet(),
        _set(_gpu, "volumeMounts", [{"name": "data", "mountPath": "/data"}]),
    ),
    (
        "a hostPath volume of the pipe dir",
        LEGACY,
        Fleet(),
        _set(_spec, "volumes", [{"name": "pipe", "hostPath": {"path": names.MPS_PIPE_DIRECTORY}}]),
    ),
    (
        "a volume with our volume's name",
        LEGACY,
        Fleet(),
        _set(_spec, "volumes", [{"name": mutate.MPS_VOLUME}]),
    ),
    ("a runtimeClassName of its own", RUNTIME_CLASS, Fleet(), _set(_spec, "runtimeClassName", "kata")),
    ("our runtimeClassName already", RUNTIME_CLASS, Fleet(), _set(_spec, "runtimeClassName", "gpupack")),
    ("an affinity of its own", LEGACY, Fleet(), _set(_spec, "affinity", _affinity(ZONE_TERM))),
    ("our affinity already", LEGACY, Fleet(), _set(_spec, "affinity", _affinity(OUR_TERM))),
    ("an empty affinity term", LEGACY, Fleet(), _set(_spec, "affinity", _affinity())),
    ("our schedulerName already", SCHEDULER, Fleet(), _set(_spec, "schedulerName", "gpupack-scheduler")),
    ("a fleet of small GPUs", LEGACY, SMALL, _no_change),
    ("a scheduler name to set", SCHEDULER, Fleet(), _no_change),
    ("a RuntimeClass to set", RUNTIME_CLASS, Fleet(), _no_change),
    ("another pipe host dir", Settings(mps_pipe_host_dir="/run/mps"), Fleet(), _no_change),
]


@pytest.mark.parametrize(
    ("settings", "fleet", "change"), [c[1:] for c in CHANGES], ids=[c[0] for c in CHANGES]
)
def test_a_pod_differing_in_one_input_gets_its_own_patch(
    settings: Settings, fleet: Fleet, change: Callable[[dict[str, Any]], None]
) -> None:
    base = _pod()
    changed = copy.deepcopy(base)
    change(changed)
    # The pod changed is compared under the same settings and fleet; a new setting or fleet with the default.
    before = (LEGACY, Fleet()) if change is _no_change else (settings, fleet)
    first_base, first_changed = _first_answer(base, *before), _first_answer(changed, settings, fleet)
    seen = _answer(base, *before)  # the tables now hold the base pod's patch
    answer = _answer(changed, settings, fleet)
    assert (seen, answer) == (first_base, first_changed)
    assert answer != seen
    assert _answer(changed, settings, fleet) == answer  # and again, from the tables


def test_replicas_of_a_workload_share_one_patch() -> None:
    first = mutate.decide(_review(_pod()), LEGACY, None, Fleet())
    again = mutate.decide(_review(_pod()), LEGACY, None, Fleet())
    assert first.response == again.response and first.ops == again.ops > 0


def test_exact_tells_apart_what_json_tells_apart() -> None:
    values = [None, "1", 1, 1.0, True, [1], (1,), {"a": 1}, [["a", 1]], {"a": [1]}, {"a": (1,)}, []]
    frozen = [mutate.exact(v) for v in values]
    for i, a in enumerate(frozen):
        for j, b in enumerate(frozen):
            assert (a == b) == (i == j), (values[i], values[j])


ASKS = [
    {names.GPU_FRACTION: "0.5"},
    {names.GPU_FRACTION: "0.5", names.GPU_MODEL: "T4"},
    {names.GPU_FRACTION: "0.5", names.GPU_MODEL: "A100-80GB"},
    {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_NUM_DEVICES: "2"},
    {names.GPU_MEMORY: "4Gi"},
    {names.GPU_MEMORY: "4Gi", names.GPU_MODEL: "T4"},
    {names.MIG_PROFILE: "1g.10gb"},
    {names.MIG_PROFILE: "1g.10gb", names.GPU_MODEL: "A100-40GB"},
]


@pytest.mark.parametrize("fleet", [Fleet(), SMALL], ids=["no fleet known", "a fleet of T4s"])
def test_each_ask_in_turn_gets_its_own_resources(fleet: Fleet) -> None:
    """The resources are kept per amount asked, models allowed and fleet: asks that differ in any of them,
    one after the other, each get what gpu_resources says of that request."""
    for ask in ASKS:
        pod = _pod()
        pod["metadata"]["annotations"] = ask
        parsed = request.parse(podview.read(pod))
        assert isinstance(parsed, request.GpuRequest)
        want = {k: str(v) for k, v in mutate.gpu_resources(parsed, fleet).items()}
        ops = _answer(pod, LEGACY, fleet)
        [written] = [op["value"] for op in ops if op["path"] == "/spec/containers/0/resources"]
        assert written == {"requests": want, "limits": want}, ask
