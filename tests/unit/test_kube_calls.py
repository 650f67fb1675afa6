"""Exact API calls built by app.kube.calls (pure)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from app.core import names
from app.core.model import Allocation
from app.kube import calls
from app.kube.calls import JSON_PATCH, MERGE_PATCH

ALLOC = Allocation(node="n1", gpu_indexes=(0, 3), gpu_uuids=("GPU-a", "GPU-b"), milli=250, memory_mib=4096)


def test_allocation_patch_is_merge_patch_with_resource_version_precondition() -> None:
    req = calls.allocation_patch("team-a", "train-1", "4711", ALLOC)
    assert req.method == "PATCH"
    assert req.path == "/api/v1/namespaces/team-a/pods/train-1"
    assert req.content_type == MERGE_PATCH
    assert req.body == {
        "metadata": {
            "resourceVersion": "4711",
            "annotations": {
                "gpupack.io/node": "n1",
                "gpupack.io/gpu-uuids": "GPU-a,GPU-b",
                "gpupack.io/gpu-indexes": "0,3",
                "gpupack.io/gpu-milli": "250",
                "gpupack.io/memory-limit-mib": "4096",
                "gpupack.io/thread-percentage": "25",
                "gpupack.io/mps-memory-limit": "0=4096M,1=4096M",
            },
        }
    }


def test_clear_allocation_nulls_every_allocation_key() -> None:
    req = calls.clear_allocation_patch("ns", "p", "9")
    assert req.content_type == MERGE_PATCH
    assert req.body == {
        "metadata": {"resourceVersion": "9", "annotations": dict.fromkeys(names.ALLOCATION_ANNOTATIONS)}
    }


def test_allocation_json_patch_tests_resource_version_first_and_escapes_slashes() -> None:
    req = calls.allocation_json_patch("ns", "p", "12", ALLOC)
    assert req.content_type == JSON_PATCH
    assert req.body[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "12"}
    assert req.body[1] == {"op": "add", "path": "/metadata/annotations/gpupack.io~1node", "value": "n1"}
    # every allocation annotation but a burstable pod's hard limit, which this allocation has not
    assert len(req.body) == len(names.ALLOCATION_ANNOTATIONS)
    burstable = calls.allocation_json_patch(
        "ns", "p", "12", replace(ALLOC, hard_limit_mib=ALLOC.memory_mib * 2)
    )
    assert burstable.body[-1] == {
        "op": "add",
        "path": "/metadata/annotations/gpupack.io~1memory-hard-limit-mib",
        "value": str(ALLOC.memory_mib * 2),
    }


def test_binding_body_targets_node_and_carries_uid() -> None:
    req = calls.binding("ns", "p", "uid-1", "n1")
    assert (req.method, req.path) == ("POST", "/api/v1/namespaces/ns/pods/p/binding")
    assert req.body == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }
    fenced = calls.binding("ns", "p", "uid-1", "n1", resource_version="42")
    assert fenced.body["metadata"]["resourceVersion"] == "42"


def test_list_and_watch_queries() -> None:
    req = calls.list_request("/api/v1/pods", calls.MANAGED_SELECTOR, 500, "tok")
    assert req.query == {"labelSelector": "gpupack.io/managed=true", "limit": 500, "continue": "tok"}
    assert calls.list_request("/x").query == {}
    assert calls.watch_query("", "77") == {"resourceVersion": "77"}


def test_lease_update_carries_resource_version_and_microtimes() -> None:
    spec = calls.lease_spec("me", 15, 0.0, 1.5, 2)
    assert spec == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "acquireTime": "1970-01-01T00:00:00.000000Z",
        "renewTime": "1970-01-01T00:00:01.500000Z",
        "leaseTransitions": 2,
    }
    req = calls.update_lease("sys", "l", "33", spec)
    assert (req.method, req.path) == ("PUT", "/apis/coordination.k8s.io/v1/namespaces/sys/leases/l")
    assert req.body["metadata"] == {"name": "l", "namespace": "sys", "resourceVersion": "33"}
    create = calls.create_lease("sys", "l", spec)
    assert (create.method, create.path) == ("POST", "/apis/coordination.k8s.io/v1/namespaces/sys/leases")


def test_time_round_trip_and_bad_input() -> None:
    assert calls.parse_time(calls.micro_time(1234.25)) == 1234.25
    assert calls.parse_time("2024-01-01T00:00:00Z") == 1704067200.0
    assert calls.parse_time("yesterday") is None
    assert calls.parse_time(None) is None


def _obj(api_version: str, kind: str, namespace: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"namespace": namespace} if namespace else {},
    }


RBAC, ADMISSION = "rbac.authorization.k8s.io/v1", "admissionregistration.k8s.io/v1"


@pytest.mark.parametrize(
    ("obj", "namespace", "path"),
    [
        pytest.param(_obj("v1", "Namespace"), None, "/api/v1/namespaces", id="cluster-scoped-core"),
        pytest.param(_obj("v1", "Pod", "a"), None, "/api/v1/namespaces/a/pods", id="namespaced-core"),
        pytest.param(_obj("v1", "Pod", "a"), "b", "/api/v1/namespaces/b/pods", id="namespace-argument-wins"),
        pytest.param(
            _obj(RBAC, "RoleBinding", "s"),
            None,
            f"/apis/{RBAC}/namespaces/s/rolebindings",
            id="namespaced-group",
        ),
        pytest.param(
            _obj(ADMISSION, "ValidatingAdmissionPolicy"),
            None,
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
            id="cluster-scoped-group",
        ),
        pytest.param(
            _obj("node.k8s.io/v1", "RuntimeClass"),
            None,
            "/apis/node.k8s.io/v1/runtimeclasses",
            id="runtime-class",
        ),
    ],
)
def test_create_posts_the_object_to_its_collection(
    obj: dict[str, Any], namespace: str | None, path: str
) -> None:
    req = calls.create(obj, namespace)
    assert (req.method, req.path, req.body, dict(req.query)) == ("POST", path, obj, {})


def test_create_dry_run_asks_the_apiserver_not_to_store() -> None:
    req = calls.create({"apiVersion": "v1", "kind": "Pod", "metadata": {}}, "ns", dry_run=True)
    assert (req.path, dict(req.query)) == ("/api/v1/namespaces/ns/pods", {"dryRun": "All"})


def test_create_refuses_a_kind_it_has_no_collection_for() -> None:
    with pytest.raises(ValueError, match=r"^kind='Deployment': must be one of ClusterRole, "):
        calls.create({"apiVersion": "apps/v1", "kind": "Deployment"})
