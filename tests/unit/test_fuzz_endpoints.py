"""Property: no body sent to /filter, /prioritize, /bind or /mutate is answered 5xx, and 4xx names the field.

Bodies are structured pods (or AdmissionReviews, or binding args) where any level may be replaced by a
value of the wrong type, plus arbitrary JSON. 1000 examples per endpoint, through FastAPI's TestClient.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_deploy_chart import REQUEST_KEYS

from app.core import names
from app.core.errors import KubeError
from app.core.model import Demand
from app.core.placement import registry
from app.core.pods import pod_info
from app.core.podview import read
from app.core.request import pod_demand
from app.kube.assume import AssumeCache
from app.kube.cache import ClusterCache
from app.kube.calls import JsonDict, Request
from app.kube.gpunode import GPUNode, GPUNodeSpec, GPUNodeStatus, GpuSpec, GpuStatus
from extender.binder import Binder
from extender.config import Settings as ExtenderSettings
from extender.main import create_app as extender_app
from extender.routes import scheduling
from tests.static_runtime import StaticRuntime
from webhook.main import create_app as webhook_app
from webhook.settings import Settings as WebhookSettings

FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))

# --- strategies ---

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
any_json = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def either(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The right shape most of the time, any JSON value (usually of the wrong type) otherwise."""
    return st.one_of(good, good, good, any_json)


ANNOTATION_KEYS = (*REQUEST_KEYS, names.ALLOC_GPU_MILLI, "other")
ANNOTATION_VALUES = ("0.5", "1", "0.25", "4096", "4Gi", "2", "main", "V100M16|A100", "nan", "", "-1")
RESOURCES = (names.RESOURCE_GPU_MILLI, names.RESOURCE_GPU_MEMORY_MIB, "nvidia.com/gpu", "cpu")
QUANTITIES = ("500", "1k", "0.5", "8192", "-3", "1Gi", "x")

text = st.text(max_size=12)
pod_annotations = either(
    st.dictionaries(
        st.one_of(st.sampled_from(ANNOTATION_KEYS), text),
        either(st.sampled_from(ANNOTATION_VALUES)),
        max_size=4,
    )
)
quantity_map = either(
    st.dictionaries(st.sampled_from(RESOURCES), either(st.sampled_from(QUANTITIES)), max_size=3)
)
resources = either(st.fixed_dictionaries({}, optional={"requests": quantity_map, "limits": quantity_map}))
env_list = either(
    st.lists(
        either(st.fixed_dictionaries({"name": either(text)}, optional={"value": either(text)})), max_size=2
    )
)
container = either(
    st.fixed_dictionaries(
        {"name": either(st.sampled_from(("main", "side", "")))},
        optional={
            "resources": resources,
            "env": env_list,
            "volumeMounts": either(st.lists(any_json, max_size=2)),
        },
    )
)
containers = either(st.lists(container, max_size=3))
affinity = either(
    st.fixed_dictionaries(
        {},
        optional={
            "nodeAffinity": either(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "requiredDuringSchedulingIgnoredDuringExecution": either(
                            st.fixed_dictionaries(
                                {"nodeSelectorTerms": either(st.lists(any_json, max_size=2))}
                            )
                        )
                    },
                )
            )
        },
    )
)
metadata = either(
    st.fixed_dictionaries(
        {},
        optional={
            "name": either(text),
            "namespace": either(text),
            "uid": either(text),
            "annotations": pod_annotations,
            "labels": either(st.dictionaries(text, either(text), max_size=2)),
        },
    )
)
spec = either(
    st.fixed_dictionaries(
        {"containers": containers},
        optional={
            "initContainers": containers,
            "nodeName": either(text),
            "affinity": affinity,
            "schedulerName": either(text),
            "volumes": either(st.lists(any_json, max_size=2)),
        },
    )
)
pod = either(st.fixed_dictionaries({"metadata": metadata, "spec": spec}))
node_list = either(
    st.fixed_dictionaries(
        {"items": either(st.lists(either(st.fixed_dictionaries({"metadata": metadata})), max_size=2))}
    )
)
extender_args = either(
    st.fixed_dictionaries(
        {"Pod": pod},
        optional={
            "NodeNames": either(st.lists(either(st.sampled_from(("n1", "n2", "ghost"))), max_size=3)),
            "Nodes": node_list,
        },
    )
)
binding_args = either(
    st.fixed_dictionaries(
        {"PodName": either(text), "PodNamespace": either(text), "Node": either(text)},
        optional={"PodUID": either(text)},
    )
)
gvk = either(
    st.fixed_dictionaries(
        {"group": either(st.just("")), "version": either(st.just("v1")), "kind": either(st.just("Pod"))}
    )
)
gvr = either(
    st.fixed_dictionaries(
        {"group": either(st.just("")), "version": either(st.just("v1")), "resource": either(st.just("pods"))}
    )
)
admission_review = either(
    st.fixed_dictionaries(
        {
            "apiVersion": either(st.just("admission.k8s.io/v1")),
            "kind": either(st.just("AdmissionReview")),
            "request": either(
                st.fixed_dictionaries(
                    {
                        "uid": either(st.just("uid-1")),
                        "kind": gvk,
                        "resource": gvr,
                        "operation": either(st.sampled_from(("CREATE", "UPDATE"))),
                        "object": pod,
                    },
                    optional={"namespace": either(text), "name": either(text), "dryRun": any_json},
                )
            ),
        }
    )
)
raw_bodies = st.one_of(st.binary(max_size=40), st.text(max_size=40).map(str.encode))

# --- apps ---


class NoPods:
    """app.kube for bind: every pod is gone (binding args are what is fuzzed here, not the apiserver)."""

    def send(self, req: Request) -> JsonDict:
        raise KubeError(404, "NotFound", f"{req.path} not found")


def _gpunode(name: str) -> JsonDict:
    spec = GPUNodeSpec(
        node_name=name,
        gpus=(
            GpuSpec(uuid=f"GPU-{name}-0", index=0, model="V100M16", product_name="Tesla", memory_mib=16384),
        ),
    )
    status = GPUNodeStatus(
        heartbeat_time=time.time(), gpus=(GpuStatus(uuid=f"GPU-{name}-0", index=0, healthy=True),)
    )
    return GPUNode.of(name, spec, status).wire()


@pytest.fixture(scope="module")
def extender() -> Iterator[TestClient]:
    cache = ClusterCache(AssumeCache(ttl_s=60))
    cache.set_gpunodes([_gpunode("n1"), _gpunode("n2")])
    policy = registry.create("binpack")
    runtime = StaticRuntime(cache, policy, Binder(NoPods(), cache, policy))  # type: ignore[arg-type]
    with TestClient(extender_app(ExtenderSettings(policy="binpack"), runtime=runtime)) as client:
        yield client


@pytest.fixture(scope="module")
def webhook() -> Iterator[TestClient]:
    with TestClient(webhook_app(WebhookSettings())) as client:
        yield client


def _post(client: TestClient, path: str, body: Any) -> Any:
    if isinstance(body, bytes):
        return client.post(path, content=body, headers={"Content-Type": "application/json"})
    return client.post(path, json=body)


def assert_no_5xx_and_named(response: Any, body: Any) -> None:
    assert response.status_code < 500, (body, response.text[:400])
    if 400 <= response.status_code < 500:
        out = response.json()
        problems = out["detail"]
        assert problems, out
        for p in problems:
            assert p["loc"] and p["loc"][0] == "body", p
            assert p["msg"], p
        # The one-line message names the first problem's field path.
        field = ".".join(str(x) for x in problems[0]["loc"][1:]) or "body"
        assert out["message"].startswith(field), out


# --- properties ---


@FUZZ
@given(body=st.one_of(extender_args, extender_args, extender_args, any_json, raw_bodies))
def test_filter_never_5xx(extender: TestClient, body: Any) -> None:
    r = _post(extender, "/filter", body)
    assert_no_5xx_and_named(r, body)
    if r.status_code == 200:
        assert set(r.json()) >= {"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


def _reading(parsed: Any) -> Any:
    """What the verbs read of a parsed request: the pod as sent, its checked shape and the node names;
    or the error answer."""
    if isinstance(parsed, tuple):
        return parsed
    # json.dumps: NaN == NaN there, as a body may hold one
    return json.dumps([parsed.pod(), parsed.Pod.model_dump(), parsed.node_names()], default=str)


@FUZZ
@given(body=st.one_of(extender_args, extender_args, extender_args, any_json, raw_bodies))
def test_filter_and_prioritize_bodies_read_as_by_the_json_reader_and_schema(body: Any) -> None:
    # The usual body is decoded by msgspec straight into the pod and the names; every body must read
    # as reading it to Python and validating it against the schema reads it: the same request, or the
    # same 422/400 with the same messages.
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    assert _reading(scheduling._parse(raw)) == _reading(scheduling._parse_read(raw))
    # A key given twice: the last one counts, as in every JSON reader the extender has.
    twice = b'{"Pod": {"metadata": {"uid": "first"}}, "NodeNames": ["first"], "Pod": ' + raw + b"}"
    assert _reading(scheduling._parse(twice)) == _reading(scheduling._parse_read(twice))


@FUZZ
@given(body=st.one_of(extender_args, extender_args, extender_args, any_json, raw_bodies))
def test_prioritize_never_5xx(extender: TestClient, body: Any) -> None:
    r = _post(extender, "/prioritize", body)
    assert_no_5xx_and_named(r, body)
    if r.status_code == 200:
        assert all(0 <= h["Score"] <= 10 for h in r.json())


@FUZZ
@given(body=st.one_of(binding_args, binding_args, binding_args, any_json, raw_bodies))
def test_bind_never_5xx(extender: TestClient, body: Any) -> None:
    r = _post(extender, "/bind", body)
    assert_no_5xx_and_named(r, body)
    if r.status_code == 200:
        assert "not found" in r.json()["Error"]


@FUZZ
@given(body=st.one_of(admission_review, admission_review, admission_review, any_json, raw_bodies))
def test_mutate_never_5xx_nor_internal_error(webhook: TestClient, body: Any) -> None:
    r = _post(webhook, "/mutate", body)
    assert_no_5xx_and_named(r, body)
    if r.status_code == 200:
        response = r.json()["response"]
        # A bug in the mutation would surface as a denial with code 500 (see webhook.main._internal_error).
        assert (response.get("status") or {}).get("code") != 500, (body, response)
        if "patch" in response:
            assert isinstance(json.loads(base64.b64decode(response["patch"])), list)


# --- the cases the issue reported, pinned ---

REPORTED = [
    pytest.param({"metadata": "x", "spec": {"containers": []}}, "Pod.metadata", id="metadata-string"),
    pytest.param({"metadata": {"annotations": ["a"]}, "spec": {}}, "Pod.metadata.annotations", id="ann-list"),
    pytest.param(
        {"metadata": {"annotations": {"gpu-fraction": 0.5}}, "spec": {}},
        "Pod.metadata.annotations.gpu-fraction",
        id="ann-float",
    ),
    pytest.param({"metadata": {}, "spec": {"containers": [1]}}, "Pod.spec.containers.0", id="containers-int"),
    pytest.param(
        {"metadata": {}, "spec": {"containers": [{"name": "c", "resources": {"limits": []}}]}},
        "Pod.spec.containers.0.resources.limits",
        id="limits-list",
    ),
]


@pytest.mark.parametrize(("bad_pod", "field"), REPORTED)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_reported_bodies_are_422_naming_the_field(
    extender: TestClient, verb: str, bad_pod: JsonDict, field: str
) -> None:
    r = extender.post(f"/{verb}", json={"Pod": bad_pod, "NodeNames": ["n1"]})
    assert r.status_code == 422
    assert r.json()["message"].startswith(field + ":"), r.json()


def test_bind_with_number_for_name_is_422(extender: TestClient) -> None:
    r = extender.post("/bind", json={"PodName": 7, "PodNamespace": "ns", "Node": "n1"})
    assert r.status_code == 422
    assert r.json()["message"].startswith("PodName:"), r.json()


# --- the pod readers behind the schemas: the informer hands them whatever the apiserver stored ---


@FUZZ
@given(obj=st.one_of(pod, any_json))
def test_pod_readers_never_raise_on_wrong_types(obj: Any) -> None:
    if not isinstance(obj, dict):
        return
    info = pod_info(obj)
    assert isinstance(info.demand, Demand | tuple)
    assert pod_demand(read(obj)) == info.demand


UNPARSED = [
    pytest.param(b"", 422, "body: Field required", id="empty"),
    pytest.param(b'{"Pod": ', 422, "body: JSON decode error at character 8", id="cut-short"),
    pytest.param(b'{"Pod": "\x80"}', 400, "body: There was an error parsing the body", id="not-utf8"),
]


@pytest.mark.parametrize(("body", "status", "message"), UNPARSED)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_bodies_that_are_not_json_name_the_body(
    extender: TestClient, verb: str, body: bytes, status: int, message: str
) -> None:
    r = _post(extender, f"/{verb}", body)
    assert (r.status_code, r.json()["message"]) == (status, message)


# JSON that the fast reader refuses and `json.loads` accepts: answered as the same body in UTF-8 was.
OTHER_ENCODINGS = [
    pytest.param(lambda text: text.encode("utf-16"), id="utf-16"),
    pytest.param(lambda text: text.encode("utf-32-le"), id="utf-32-le"),
    pytest.param(lambda text: text.encode("utf-8-sig"), id="utf-8-bom"),
]


@pytest.mark.parametrize("encode", OTHER_ENCODINGS)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_bodies_in_other_json_encodings_are_answered_as_utf8(
    extender: TestClient, verb: str, encode: Any
) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-enc", "labels": {names.LABEL_MANAGED: "true"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {names.RESOURCE_GPU_MILLI: "500"}}}]},
    }
    text = json.dumps({"Pod": pod, "NodeNames": ["n1", "n2", "gone"]})
    want = _post(extender, f"/{verb}", text.encode())
    got = _post(extender, f"/{verb}", encode(text))
    assert want.status_code == 200, want.text
    assert (got.status_code, got.json()) == (200, want.json())
