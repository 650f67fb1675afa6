"""webhook.mutate without a server: golden reviews, idempotency, and the patch's effect on odd pod shapes."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app.core import names, podview, request, units
from webhook import mutate
from webhook.metrics import WebhookOutcome
from webhook.schemas import AdmissionReview
from webhook.settings import Settings

GOLDEN = Path(__file__).parents[1] / "golden" / "webhook"
CASES = sorted(GOLDEN.glob("*.input.json"))


# --- a small RFC 6902 applier (add/replace/remove), enough to check what our patches do ---


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [_unescape(t) for t in op["path"].split("/")[1:]]
        target = doc
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        if op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        elif isinstance(target, list):
            if op["op"] == "add":
                target.insert(len(target) if last == "-" else int(last), copy.deepcopy(op["value"]))
            else:
                assert op["op"] == "replace" and 0 <= int(last) < len(target), op
                target[int(last)] = copy.deepcopy(op["value"])
        else:
            assert op["op"] == "add" or last in target, op  # replace needs an existing member
            target[last] = copy.deepcopy(op["value"])
    return doc


def decoded(response: dict[str, Any]) -> list[dict[str, Any]]:
    inner = response["response"]
    if "patch" not in inner:
        return []
    assert inner["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(inner["patch"]))
    return ops


def review_of(obj: dict[str, Any], uid: str = "u-1") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "default",
            "object": obj,
        },
    }


def decide(body: dict[str, Any], settings: Settings, pod_security: str | None = None) -> mutate.Decision:
    """A review (dict) decided as the app does it: validated first."""
    return mutate.decide(AdmissionReview.model_validate(body), settings, pod_security)


def pod(annotations: dict[str, str] | None, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"containers": list(containers) or [{"name": "main"}], **spec}}


def as_apiserver_stores(obj: dict[str, Any]) -> dict[str, Any]:
    """What a reinvocation sees: quantities in canonical form (1000 → 1k, 16384 stays), defaults filled in."""
    out = copy.deepcopy(obj)
    for c in out["spec"]["containers"] + out["spec"].get("initContainers", []):
        for part in (c.get("resources") or {}).values():
            for key, value in part.items():
                if str(value).endswith("000"):
                    part[key] = f"{int(value) // 1000}k"
        for mount in c.get("volumeMounts") or ():
            mount.setdefault("readOnly", False)
        c.setdefault("terminationMessagePath", "/dev/termination-log")
    out["spec"].setdefault("schedulerName", "default-scheduler")
    return out


# --- golden files ---


def render(review: dict[str, Any]) -> dict[str, Any]:
    """The response with the patch decoded, plus the pod the patch produces: what a reviewer wants to read."""
    AdmissionReview.model_validate(review)  # every golden input is a valid review
    response = mutate.review(review, Settings())
    out: dict[str, Any] = {"response": copy.deepcopy(response)}
    ops = decoded(response)
    if ops:
        out["response"]["response"]["patch"] = ops
        out["mutated_object"] = apply_patch(review["request"]["object"], ops)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name.removesuffix(".input.json") for c in CASES])
def test_golden(case: Path, golden: Callable[[Path, Any], None]) -> None:
    golden(
        case.with_name(case.name.replace(".input.json", ".output.json")), render(json.loads(case.read_text()))
    )


def test_golden_cases_cover_every_outcome() -> None:
    outcomes = {decide(json.loads(c.read_text()), Settings()).outcome for c in CASES}
    assert outcomes == {WebhookOutcome.MUTATED, WebhookOutcome.SKIPPED, WebhookOutcome.DENIED}


@pytest.mark.parametrize("case", CASES, ids=[c.name.removesuffix(".input.json") for c in CASES])
@pytest.mark.parametrize(
    "settings",
    [Settings(), Settings(scheduler_name="gpupack"), Settings(runtime_class="gpupack")],
    ids=["default", "scheduler", "runtime-class"],
)
def test_second_pass_changes_nothing(case: Path, settings: Settings) -> None:
    """reinvocationPolicy IfNeeded: the mutated pod, as the apiserver stores it, gets an empty patch."""
    review = json.loads(case.read_text())
    first = decide(review, settings)
    if first.outcome is not WebhookOutcome.MUTATED:
        return
    mutated = apply_patch(review["request"]["object"], decoded(first.response))
    again = review_of(as_apiserver_stores(mutated))
    second = decide(again, settings)
    assert second.outcome is WebhookOutcome.MUTATED
    assert decoded(second.response) == []


# --- targeted behaviour ---


def test_fraction_pod_gets_everything() -> None:
    decision = decide(
        review_of(pod({names.GPU_FRACTION: "0.3", names.GPU_FRACTION_NUM_DEVICES: "3"})), Settings()
    )
    obj = apply_patch(pod({names.GPU_FRACTION: "0.3"}), decoded(decision.response))
    main = obj["spec"]["containers"][0]
    assert obj["metadata"]["labels"] == {names.LABEL_MANAGED: "true"}
    # quota charge: 3 x 0.3 of the largest GPU the catalogue knows (A100-80GB, 81920 MiB) = 3 x 24576 MiB
    charged = {
        names.RESOURCE_GPU_MILLI: "900",
        names.RESOURCE_QUOTA_GPU_MILLI: "900",
        names.RESOURCE_QUOTA_GPU_MEMORY_MIB: "73728",
    }
    assert main["resources"] == {"requests": charged, "limits": charged}
    env = {e["name"]: e for e in main["env"]}
    assert set(env) == {
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "CUDA_MPS_PIPE_DIRECTORY",
        "GPUPACK_MEMORY_LIMIT_MIB",
    }
    ref = env["NVIDIA_VISIBLE_DEVICES"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert ref == "metadata.annotations['gpupack.io/gpu-uuids']"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/nvidia-mps"}
    terms = obj["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": names.NODE_LABEL_ENABLED, "operator": "In", "values": ["true"]}]}
        ]
    }
    assert "schedulerName" not in obj["spec"]


def test_memory_request_adds_memory_resource_and_gt_affinity() -> None:
    obj = pod({names.GPU_MEMORY: "4Gi", names.GPU_FRACTION_NUM_DEVICES: "2"})
    out = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings())))
    limits = out["spec"]["containers"][0]["resources"]["limits"]
    # quota charge: 2 x the share 4096 MiB takes of the smallest GPU that holds it (T4, 15109 MiB): 2 x 272
    assert limits == {
        names.RESOURCE_GPU_MEMORY_MIB: "8192",
        names.RESOURCE_QUOTA_GPU_MILLI: "544",
        names.RESOURCE_QUOTA_GPU_MEMORY_MIB: "8192",
    }
    exprs = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": names.NODE_LABEL_GPU_MEMORY_MAX_MIB, "operator": "Gt", "values": ["4095"]} in (
        exprs["nodeSelectorTerms"][0]["matchExpressions"]
    )


def test_scheduler_name_only_when_configured() -> None:
    obj = pod({names.GPU_FRACTION: "0.5"}, schedulerName="default-scheduler")
    plain = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings())))
    assert plain["spec"]["schedulerName"] == "default-scheduler"
    ours = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings(scheduler_name="gpupack"))))
    assert ours["spec"]["schedulerName"] == "gpupack"


def test_mps_pipe_host_dir_is_configurable() -> None:
    obj = pod({names.GPU_FRACTION: "0.5"})
    out = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings(mps_pipe_host_dir="/run/mps"))))
    assert out["spec"]["volumes"] == [
        {"name": "gpupack-mps-pipe", "hostPath": {"path": "/run/mps", "type": "DirectoryOrCreate"}}
    ]


def test_user_env_of_ours_is_refused_not_overwritten() -> None:
    """A user's NVIDIA_VISIBLE_DEVICES=all would expose every GPU; we neither overwrite nor keep it."""
    obj = pod(
        {names.GPU_FRACTION: "0.5"},
        {
            "name": "main",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "X", "value": "1"}],
        },
    )
    decision = decide(review_of(obj), Settings())
    assert decision.outcome is WebhookOutcome.DENIED
    assert decision.messages == (
        "spec.containers[main].env[NVIDIA_VISIBLE_DEVICES]='all': is set by gpupack on the GPU container "
        "from the pod's allocation (the gpupack.io/* annotations written when it is scheduled); remove it",
    )


def test_user_env_equal_to_ours_is_kept() -> None:
    obj = pod(
        {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_CONTAINER_NAME: "main"},
        {"name": "main", "env": [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/nvidia-mps"}]},
        {"name": "side", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]},
    )
    out = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings())))
    main, side = out["spec"]["containers"]
    assert [e["name"] for e in main["env"]].count("CUDA_MPS_PIPE_DIRECTORY") == 1
    assert side["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def test_every_user_term_keeps_its_own_expressions() -> None:
    user_terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
        {"matchExpressions": [{"key": names.NODE_LABEL_ENABLED, "operator": "In", "values": ["true"]}]},
    ]
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": user_terms}}
    }
    obj = pod({names.GPU_FRACTION: "0.5", names.GPU_MODEL: "T4"}, affinity=copy.deepcopy(affinity))
    out = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings())))
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    ours = [
        {"key": names.NODE_LABEL_ENABLED, "operator": "In", "values": ["true"]},
        {"key": names.NODE_LABEL_GPU_MODEL, "operator": "In", "values": ["T4"]},
    ]
    assert len(terms) == 3
    assert terms[0]["matchExpressions"] == [user_terms[0]["matchExpressions"][0], *ours]
    assert terms[1] == {"matchFields": user_terms[1]["matchFields"], "matchExpressions": ours}
    assert terms[2]["matchExpressions"] == ours  # the one already there is not repeated


@pytest.mark.parametrize(
    "affinity",
    [
        pytest.param({}, id="empty-affinity"),
        pytest.param({"podAffinity": {}}, id="pod-affinity-only"),
        pytest.param(
            {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}, id="preferred-only"
        ),
        pytest.param(
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}, id="required-no-terms"
        ),
        pytest.param(
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
            id="empty-terms",
        ),
        pytest.param(
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}}},
            id="empty-term",
        ),
    ],
)
def test_affinity_added_at_any_depth(affinity: dict[str, Any]) -> None:
    obj = pod({names.GPU_FRACTION: "0.5"}, affinity=affinity)
    out = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings())))
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchExpressions": [{"key": names.NODE_LABEL_ENABLED, "operator": "In", "values": ["true"]}]}
    ]
    for key, value in affinity.items():
        if key != "nodeAffinity":
            assert out["spec"]["affinity"][key] == value


def test_stale_resource_from_an_earlier_pass_is_replaced() -> None:
    """Annotations changed by a later webhook between passes: the old resource goes, the new one comes."""
    stale = {
        "name": "main",
        "resources": {"requests": {names.RESOURCE_GPU_MILLI: "500"}, "limits": {"cpu": "1"}},
    }
    obj = pod({names.GPU_MEMORY: "1024"}, stale)
    out = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings())))
    charged = {
        names.RESOURCE_GPU_MEMORY_MIB: "1024",
        names.RESOURCE_QUOTA_GPU_MILLI: "68",  # 1024 MiB of a T4's 15109, rounded up
        names.RESOURCE_QUOTA_GPU_MEMORY_MIB: "1024",
    }
    assert out["spec"]["containers"][0]["resources"] == {
        "requests": charged,
        "limits": {"cpu": "1", **charged},
    }


def test_denial_shape() -> None:
    response = mutate.review(
        review_of(pod({names.GPU_FRACTION: "1.5", names.GPU_FRACTION_NUM_DEVICES: "x"})), Settings()
    )
    assert response == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": "u-1",
            "allowed": False,
            "status": {
                "status": "Failure",
                "code": 422,
                "reason": "Invalid",
                "message": "gpu-fraction='1.5': must be a decimal in (0, 1] with at most 2 decimals; "
                "gpu-fraction-num-devices='x': must be an integer from 1 to 16",
            },
        },
    }


@pytest.mark.parametrize(
    "request_patch",
    [
        pytest.param({"operation": "DELETE", "object": None}, id="delete"),
        pytest.param({"operation": "CONNECT"}, id="connect"),
        pytest.param({"kind": {"group": "apps", "version": "v1", "kind": "Deployment"}}, id="not-a-pod"),
        pytest.param({"object": None}, id="no-object"),
    ],
)
def test_never_mutates_what_is_not_a_pod_create(request_patch: dict[str, Any]) -> None:
    review = review_of(pod({names.GPU_FRACTION: "0.5"}))
    review["request"].update(request_patch)
    decision = decide(review, Settings())
    assert decision.outcome is WebhookOutcome.SKIPPED
    assert decision.response["response"] == {"uid": "u-1", "allowed": True}


def test_warnings_are_passed_to_the_user() -> None:
    response = mutate.review(review_of(pod({names.GPU_MEMORY: "500M"})), Settings())
    assert response["response"]["warnings"] == [
        "gpu-memory='500M' is 476.837158203125 MiB; rounded up to 477 MiB"
    ]


@pytest.mark.parametrize(
    ("annotations", "containers", "warnings"),
    [
        pytest.param(
            {names.GPU_FRACTION: "0.5"},
            ["log-shipper", "main"],
            [
                "gpu-fraction-container-name is not set: the GPU goes to the first container, 'log-shipper', "
                "none to 'main' (set gpu-fraction-container-name to the container that should have it)"
            ],
            id="two-containers-none-named",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5"},
            ["a", "b", "c"],
            [
                "gpu-fraction-container-name is not set: the GPU goes to the first container, 'a', "
                "none to 'b', 'c' (set gpu-fraction-container-name to the container that should have it)"
            ],
            id="three-containers-none-named",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_CONTAINER_NAME: "main"},
            ["log-shipper", "main"],
            None,
            id="named",
        ),
        pytest.param({names.GPU_FRACTION: "0.5"}, ["main"], None, id="one-container"),
    ],
)
def test_a_pod_of_several_containers_is_told_which_gets_the_gpu(
    annotations: dict[str, str], containers: list[str], warnings: list[str] | None
) -> None:
    body = pod(annotations, *({"name": c} for c in containers))
    review = mutate.review(review_of(body), Settings())
    response = review["response"]
    assert response["allowed"] is True
    assert response.get("warnings") == warnings
    # the patch gives the GPU env to the container the warning names, "void" to the others
    patched = apply_patch(body, decoded(review))
    gpu = annotations.get(names.GPU_FRACTION_CONTAINER_NAME, containers[0])
    for c in patched["spec"]["containers"]:
        visible = next(e for e in c["env"] if e["name"] == names.ENV_NVIDIA_VISIBLE_DEVICES)
        assert ("valueFrom" in visible) == (c["name"] == gpu), c["name"]


# --- property: any pod shape the schema accepts is mutated consistently and idempotently ---

_ENV_NAMES = st.sampled_from(
    ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPUPACK_MEMORY_LIMIT_MIB", "X"]
)
_QUANTITIES = st.sampled_from(["0", "1", "500", "1k", "4096", "2Gi"])
_RESOURCE_KEYS = st.sampled_from(
    ["cpu", "nvidia.com/gpu", names.RESOURCE_GPU_MILLI, names.RESOURCE_GPU_MEMORY_MIB]
)
_EXPRESSION = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["zone", names.NODE_LABEL_ENABLED, names.NODE_LABEL_GPU_MODEL]),
        "operator": st.sampled_from(["In", "NotIn", "Exists"]),
        "values": st.lists(st.sampled_from(["true", "a", "T4"]), max_size=2),
    }
)
_TERM = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"matchExpressions": st.lists(_EXPRESSION, max_size=3)}),
    st.fixed_dictionaries({"matchFields": st.lists(_EXPRESSION, max_size=1)}),
)
_AFFINITY = st.one_of(
    st.none(),
    st.just({}),
    st.fixed_dictionaries({"podAntiAffinity": st.just({})}),
    st.fixed_dictionaries(
        {
            "nodeAffinity": st.one_of(
                st.just({}),
                st.fixed_dictionaries(
                    {
                        "requiredDuringSchedulingIgnoredDuringExecution": st.fixed_dictionaries(
                            {"nodeSelectorTerms": st.lists(_TERM, max_size=3)}
                        )
                    }
                ),
            )
        }
    ),
)
# (valid values, invalid values) per annotation; most pods draw only valid ones so most get mutated.
_ANNOTATION_VALUES = {
    names.GPU_FRACTION: (["0.5", "1", "0.01"], ["1.5", "nan", ""]),
    names.GPU_MEMORY: (["4096", "8Gi", "500M"], ["0", "1e3"]),
    names.GPU_FRACTION_NUM_DEVICES: (["1", "2"], ["0"]),
    names.GPU_FRACTION_CONTAINER_NAME: (["c0", "init0"], ["c2"]),
    names.GPU_MODEL: (["T4", "T4|A10", "Tesla T4"], ["a b", ""]),
    names.ISOLATION: (["mps", "none"], ["x"]),
}


@st.composite
def _containers(draw: st.DrawFn, prefix: str, min_size: int) -> list[dict[str, Any]]:
    count = draw(st.integers(min_value=min_size, max_value=3))
    out = []
    for i in range(count):
        c: dict[str, Any] = {"name": f"{prefix}{i}", "image": "x"}
        if draw(st.booleans()):
            c["env"] = draw(
                st.lists(st.fixed_dictionaries({"name": _ENV_NAMES, "value": st.just("v")}), max_size=3)
            )
        if draw(st.booleans()):
            part = st.dictionaries(_RESOURCE_KEYS, _QUANTITIES, max_size=2)
            c["resources"] = draw(st.fixed_dictionaries({}, optional={"requests": part, "limits": part}))
        if draw(st.booleans()):
            mount = st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["data", mutate.MPS_VOLUME]),
                    "mountPath": st.sampled_from(["/d", "/m"]),
                }
            )
            c["volumeMounts"] = draw(st.lists(mount, max_size=2))
        out.append(c)
    return out


@st.composite
def _pods(draw: st.DrawFn) -> dict[str, Any]:
    hostile = draw(st.integers(0, 3)) == 0
    keys = draw(st.lists(st.sampled_from(sorted(_ANNOTATION_VALUES)), unique=True))
    annotations: dict[str, str] = {}
    for key in keys:
        valid, invalid = _ANNOTATION_VALUES[key]
        annotations[key] = draw(st.sampled_from(valid + invalid if hostile else valid))
    if not hostile and names.GPU_FRACTION in annotations and names.GPU_MEMORY in annotations:
        del annotations[draw(st.sampled_from([names.GPU_FRACTION, names.GPU_MEMORY]))]
    if draw(st.integers(0, 4)) > 0 and not podview.ask_of(annotations).wanted:
        annotations[draw(st.sampled_from([names.GPU_FRACTION, names.GPU_MEMORY]))] = draw(
            st.sampled_from(["0.25", "2048"])
        )
    spec: dict[str, Any] = {"containers": draw(_containers("c", 1))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(_containers("init", 0))
    if draw(st.booleans()):
        spec["volumes"] = draw(
            st.lists(
                st.fixed_dictionaries({"name": st.sampled_from(["data", mutate.MPS_VOLUME])}), max_size=2
            )
        )
    if (affinity := draw(_AFFINITY)) is not None:
        spec["affinity"] = affinity
    labels = draw(
        st.one_of(st.none(), st.dictionaries(st.sampled_from(["app", names.LABEL_MANAGED]), st.just("x")))
    )
    meta: dict[str, Any] = {"name": "p", "annotations": annotations}
    if labels is not None:
        meta["labels"] = labels
    return {"metadata": meta, "spec": spec}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=_pods(), scheduler=st.sampled_from([None, "gpupack"]))
def test_property_mutation_is_consistent_and_idempotent(obj: dict[str, Any], scheduler: str | None) -> None:
    review = review_of(obj)
    AdmissionReview.model_validate(review)  # the generator stays inside what the app accepts
    cfg = Settings(scheduler_name=scheduler)
    first = decide(review, cfg)
    event(first.outcome.value)
    if not podview.ask_of(obj["metadata"]["annotations"]).wanted:
        ours = [r for c in podview.read(obj).containers for r, _ in c.ours]
        if ours:  # our resources without our annotations: refused, naming each resource
            assert first.outcome is WebhookOutcome.DENIED
            assert all(r in first.response["response"]["status"]["message"] for r in ours)
        else:
            assert first.outcome is WebhookOutcome.SKIPPED and "patch" not in first.response["response"]
        return
    if first.outcome is WebhookOutcome.DENIED:
        assert first.response["response"]["status"]["message"]
        return
    assert first.outcome is WebhookOutcome.MUTATED
    out = apply_patch(obj, decoded(first.response))
    req = request.parse(podview.read(obj))
    assert isinstance(req, request.GpuRequest)
    resource, amount = req.resource
    assert out["metadata"]["labels"][names.LABEL_MANAGED] == "true"
    for c in out["spec"]["containers"] + out["spec"].get("initContainers", []):
        env = {e["name"]: e for e in c["env"]}  # last one wins, as in the kubelet
        if c["name"] == req.container:
            # An equal quantity the user already wrote ("1k" for 1000) is kept as written.
            got = {p: units.quantity_value(str(c["resources"][p][resource])) for p in ("requests", "limits")}
            assert got == {"requests": amount, "limits": amount}
            assert "fieldRef" in env["NVIDIA_VISIBLE_DEVICES"]["valueFrom"]
        else:
            assert env["NVIDIA_VISIBLE_DEVICES"] == {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:
        for want in mutate.node_requirements(req):
            assert want in term["matchExpressions"]
    assert decoded(mutate.review(review_of(out), cfg)) == []


# --- our extended resources without our annotations: refused, naming the resource and the fix ---


@pytest.mark.parametrize(
    ("containers", "extra_spec", "resource", "where"),
    [
        pytest.param(
            [{"name": "main", "resources": {"requests": {names.RESOURCE_GPU_MILLI: "600"}}}],
            {},
            names.RESOURCE_GPU_MILLI,
            "container 'main'",
            id="requests",
        ),
        pytest.param(
            [{"name": "main", "resources": {"limits": {names.RESOURCE_GPU_MEMORY_MIB: "4096"}}}],
            {},
            names.RESOURCE_GPU_MEMORY_MIB,
            "container 'main'",
            id="limits",
        ),
        pytest.param(
            [{"name": "main"}],
            {
                "initContainers": [
                    {"name": "setup", "resources": {"limits": {names.RESOURCE_GPU_MILLI: "1k"}}}
                ]
            },
            names.RESOURCE_GPU_MILLI,
            "init container 'setup'",
            id="init-container",
        ),
    ],
)
def test_our_resources_without_annotations_are_refused(
    containers: list[dict[str, Any]], extra_spec: dict[str, Any], resource: str, where: str
) -> None:
    decision = decide(review_of(pod({"app": "x"}, *containers, **extra_spec)), Settings())
    assert decision.outcome is WebhookOutcome.DENIED
    inner = decision.response["response"]
    assert inner["allowed"] is False and "patch" not in inner
    message = inner["status"]["message"]
    assert message.startswith(f"{resource}=")
    assert f"requested by {where} without a GPU-share annotation" in message
    assert f"annotate the pod with {names.GPU_FRACTION}" in message and names.GPU_MEMORY in message


def test_pod_without_our_resources_or_annotations_is_still_skipped() -> None:
    obj = pod(None, {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "1"}}})
    assert decide(review_of(obj), Settings()).outcome is WebhookOutcome.SKIPPED


def test_our_resource_on_a_non_gpu_container_is_refused() -> None:
    """Only the GPU container carries the share; another container's own request would go unaccounted."""
    obj = pod(
        {names.GPU_FRACTION: "0.5"},
        {"name": "main"},
        {"name": "side", "resources": {"requests": {names.RESOURCE_GPU_MILLI: "500"}}},
    )
    decision = decide(review_of(obj), Settings())
    assert decision.outcome is WebhookOutcome.DENIED
    assert decision.messages == (
        f"{names.RESOURCE_GPU_MILLI}='500': requested by container 'side', which is not the GPU container "
        f"('main'); remove it: the gpupack webhook sets {names.RESOURCE_GPU_MILLI} on the GPU container "
        f"from {names.GPU_FRACTION} or {names.GPU_MEMORY}",
    )


def test_our_resource_on_the_gpu_container_is_rewritten_not_refused() -> None:
    obj = pod(
        {names.GPU_FRACTION: "0.5"},
        {"name": "main", "resources": {"limits": {names.RESOURCE_GPU_MILLI: "1"}}},
    )
    decision = decide(review_of(obj), Settings())
    assert decision.outcome is WebhookOutcome.MUTATED
    out = apply_patch(obj, decoded(decision.response))
    assert out["spec"]["containers"][0]["resources"]["limits"] == {
        names.RESOURCE_GPU_MILLI: "500",
        names.RESOURCE_QUOTA_GPU_MILLI: "500",
        names.RESOURCE_QUOTA_GPU_MEMORY_MIB: "40960",
    }


def test_a_quota_charge_the_user_wrote_is_replaced_by_the_real_one() -> None:
    """A tenant cannot shrink what the quota counts: the webhook owns every gpupack.io/* resource."""
    dodge = {
        names.RESOURCE_QUOTA_GPU_MILLI: "1",
        names.RESOURCE_QUOTA_GPU_MEMORY_MIB: "1",
        "gpupack.io/x": "1",
    }
    obj = pod(
        {names.GPU_FRACTION: "0.5", names.GPU_MODEL: "T4"},
        {"name": "main", "resources": {"requests": dict(dodge), "limits": dict(dodge)}},
    )
    out = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings())))
    charged = {
        names.RESOURCE_GPU_MILLI: "500",
        names.RESOURCE_QUOTA_GPU_MILLI: "500",
        names.RESOURCE_QUOTA_GPU_MEMORY_MIB: "7554",  # half of a T4's 15109 MiB, rounded down
    }
    assert out["spec"]["containers"][0]["resources"] == {"requests": charged, "limits": charged}
