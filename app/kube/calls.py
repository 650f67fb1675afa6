"""API calls as values (pure): the `Request` that `app.kube.client.Kube.send` sends, and its builders.

Every call gpupack makes is built here (or by a module beside it) as a `Request` of method, path, body,
query and content type, so tests check the exact call and nothing below `app.kube.client` does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from app.core import names
from app.core.jsonpointer import pointer
from app.core.model import Allocation
from app.core.objects import read_json, read_list
from app.kube import paths

JsonDict = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True, slots=True)
class Request:
    """One API call, built by pure code and sent by `Kube.send`."""

    method: str
    path: str
    body: Any = None
    query: Mapping[str, str | int | bool] = field(default_factory=dict)
    content_type: str = "application/json"
    # A list call's items are read into this shape (app.core.objects.read_list): only what its reader
    # keeps of each object is built. None: the whole reply, as JSON.
    item_shape: type[Any] | None = None


def read_reply(req: Request, raw: bytes | str) -> Any:
    """The JSON body of `req`'s reply (a list call's items read into its `item_shape`); raises ValueError
    (json's error and position) when it is not JSON."""
    return read_json(raw) if req.item_shape is None else read_list(raw, req.item_shape)


MANAGED_SELECTOR = f"{names.LABEL_MANAGED}=true"


def micro_time(ts: float) -> str:
    """A Unix time as Kubernetes MicroTime (RFC 3339, microseconds, Z)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(raw: str | None) -> float | None:
    """A Kubernetes Time/MicroTime string as a Unix time; None when absent or malformed."""
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def get_pod(namespace: str, name: str) -> Request:
    return Request("GET", paths.pod(namespace, name))


def get_pdb(namespace: str, name: str) -> Request:
    return Request("GET", paths.pdb(namespace, name))


def eviction(namespace: str, name: str, uid: str = "", dry_run: bool = False) -> Request:
    """Evict a pod through the Eviction API, so PodDisruptionBudgets decide (429 when one refuses).

    With `uid`, the eviction applies only to that pod (a re-created pod of the same name is left alone);
    `dry_run` asks the apiserver to check everything and change nothing.
    """
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    if uid:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    if dry_run:
        body["deleteOptions"] = {**body.get("deleteOptions", {}), "dryRun": ["All"]}
    return Request("POST", paths.pod_eviction(namespace, name), body)


def allocation_patch(namespace: str, name: str, resource_version: str, alloc: Allocation) -> Request:
    """Write the allocation annotations only if the pod is still at `resource_version`.

    A merge patch that carries metadata.resourceVersion makes the apiserver compare it with the stored
    object and answer 409 Conflict when the pod changed since we read it.
    """
    body = {"metadata": {"resourceVersion": resource_version, "annotations": alloc.to_annotations()}}
    return Request("PATCH", paths.pod(namespace, name), body, content_type=MERGE_PATCH)


def clear_allocation_patch(namespace: str, name: str, resource_version: str) -> Request:
    """Remove the allocation annotations (after a failed Binding), again guarded by resourceVersion."""
    body = {
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": dict.fromkeys(names.ALLOCATION_ANNOTATIONS),
        }
    }
    return Request("PATCH", paths.pod(namespace, name), body, content_type=MERGE_PATCH)


def allocation_json_patch(namespace: str, name: str, resource_version: str, alloc: Allocation) -> Request:
    """The same write as a JSON patch whose `test` op is the resourceVersion precondition."""
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}
    ]
    ops += [
        {"op": "add", "path": pointer("metadata", "annotations", key), "value": value}
        for key, value in alloc.to_annotations().items()
    ]
    return Request("PATCH", paths.pod(namespace, name), ops, content_type=JSON_PATCH)


def binding(namespace: str, name: str, uid: str, node: str, resource_version: str = "") -> Request:
    """Bind the pod to `node`; metadata.uid makes the apiserver refuse a re-created pod of the same name.

    With `resource_version` the apiserver binds only a pod still at that version (else 409): passing the
    version our allocation patch produced fences the Binding against any write since, by anyone.
    """
    metadata: dict[str, str] = {"name": name, "namespace": namespace}
    if uid:
        metadata["uid"] = uid
    if resource_version:
        metadata["resourceVersion"] = resource_version
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    return Request("POST", paths.pod_binding(namespace, name), body)


# REST plurals of the kinds gpupack creates from whole objects (manifests, dev-cluster bodies).
PLURALS: Final[Mapping[str, str]] = {
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "CustomResourceDefinition": "customresourcedefinitions",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "Namespace": "namespaces",
    "Node": "nodes",
    "Pod": "pods",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "RuntimeClass": "runtimeclasses",
    "ServiceAccount": "serviceaccounts",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}


def create(obj: Mapping[str, Any], namespace: str | None = None, *, dry_run: bool = False) -> Request:
    """POST a whole object to its collection, named by its apiVersion, kind and namespace.

    The namespace is `namespace`, else the object's metadata.namespace; none for a cluster-scoped kind.
    `dry_run` asks the apiserver to admit (mutate, validate) the object without storing it.
    """
    kind = str(obj.get("kind", ""))
    if kind not in PLURALS:
        raise ValueError(f"kind={kind!r}: must be one of {', '.join(sorted(PLURALS))}")
    namespace = namespace or (obj.get("metadata") or {}).get("namespace")
    path = paths.collection(str(obj.get("apiVersion", "")), PLURALS[kind], namespace)
    return Request("POST", path, dict(obj), query={"dryRun": "All"} if dry_run else {})


def list_query(
    label_selector: str = "", limit: int = 0, continue_token: str = "", field_selector: str = ""
) -> dict[str, str | int | bool]:
    """Query for one page of a list call."""
    q: dict[str, str | int | bool] = {}
    if label_selector:
        q["labelSelector"] = label_selector
    if field_selector:
        q["fieldSelector"] = field_selector
    if limit:
        q["limit"] = limit
    if continue_token:
        q["continue"] = continue_token
    return q


def watch_query(
    label_selector: str, resource_version: str, field_selector: str = ""
) -> dict[str, str | int | bool]:
    """Query for a watch resuming after `resource_version` (the client adds watch/bookmark flags)."""
    q: dict[str, str | int | bool] = {"resourceVersion": resource_version}
    if label_selector:
        q["labelSelector"] = label_selector
    if field_selector:
        q["fieldSelector"] = field_selector
    return q


def list_request(
    path: str,
    label_selector: str = "",
    limit: int = 0,
    continue_token: str = "",
    item_shape: type[Any] | None = None,
    *,
    field_selector: str = "",
) -> Request:
    query = list_query(label_selector, limit, continue_token, field_selector)
    return Request("GET", path, query=query, item_shape=item_shape)


# --- coordination.k8s.io/v1 Lease ---


def get_lease(namespace: str, name: str) -> Request:
    return Request("GET", paths.lease(namespace, name))


def lease_spec(
    holder: str, duration_s: int, acquired: float, renewed: float, transitions: int
) -> dict[str, Any]:
    return {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration_s,
        "acquireTime": micro_time(acquired),
        "renewTime": micro_time(renewed),
        "leaseTransitions": transitions,
    }


def create_lease(namespace: str, name: str, spec: Mapping[str, Any]) -> Request:
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": dict(spec),
    }
    return Request("POST", paths.leases(namespace), body)


def update_lease(namespace: str, name: str, resource_version: str, spec: Mapping[str, Any]) -> Request:
    """Replace the lease; the resourceVersion makes it fail with 409 if anyone wrote it since we read it."""
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": resource_version},
        "spec": dict(spec),
    }
    return Request("PUT", paths.lease(namespace, name), body)
