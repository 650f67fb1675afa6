"""URL paths of the API objects gpupack reads and writes (pure)."""

from __future__ import annotations

from urllib.parse import quote

from app.core import names


def pods(namespace: str | None = None) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/pods" if namespace else "/api/v1/pods"


def pod(namespace: str, name: str) -> str:
    return f"{pods(namespace)}/{quote(name)}"


def pod_binding(namespace: str, name: str) -> str:
    return f"{pod(namespace, name)}/binding"


def pod_eviction(namespace: str, name: str) -> str:
    return f"{pod(namespace, name)}/eviction"


def resource_quotas(namespace: str | None = None) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/resourcequotas" if namespace else "/api/v1/resourcequotas"


def events(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/events"


def nodes() -> str:
    return "/api/v1/nodes"


def node(name: str) -> str:
    return f"/api/v1/nodes/{quote(name)}"


def node_status(name: str) -> str:
    return f"{node(name)}/status"


def gpunodes() -> str:
    return f"/apis/{names.GPUNODE_GROUP}/{names.GPUNODE_VERSION}/{names.GPUNODE_PLURAL}"


def gpunode(name: str) -> str:
    return f"{gpunodes()}/{quote(name)}"


def gpunode_status(name: str) -> str:
    return f"{gpunode(name)}/status"


def lease(namespace: str, name: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases/{quote(name)}"


def leases(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"


def collection(api_version: str, plural: str, namespace: str | None = None) -> str:
    """The collection of any resource: /api/v1 for the core group, /apis/<group>/<version> otherwise."""
    root = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    return f"{root}/namespaces/{quote(namespace)}/{plural}" if namespace else f"{root}/{plural}"


def namespaces() -> str:
    return "/api/v1/namespaces"


def crd(name: str) -> str:
    return f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{quote(name)}"


def service_account_token(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/serviceaccounts/{quote(name)}/token"


def pdbs(namespace: str | None = None) -> str:
    return collection("policy/v1", "poddisruptionbudgets", namespace)


def pdb(namespace: str, name: str) -> str:
    return f"{pdbs(namespace)}/{quote(name)}"
