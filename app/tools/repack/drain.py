"""The taint that keeps new shares off the nodes a repack is emptying (request builders, pure).

While `gpupack repack --goal nodes --apply` evicts pods off the nodes its plan frees, those nodes carry
`gpupack.io/draining=repack:NoSchedule`: kube-scheduler drops them before asking the extender, so neither a
replacement nor a new pod takes a share there, and an autoscaler sees nodes on their way out. The taint is
removed when the run ends, however it ends; a node the autoscaler has removed meanwhile is simply gone.

Node taints are one atomic list (no merge key), so a change is the whole list, read then written with the
read's resourceVersion: a concurrent writer (kubelet, an autoscaler) makes it fail with 409, not vanish.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from app.core import names
from app.core.objects import as_list, as_object
from app.kube import calls, paths
from app.kube.calls import Request

TAINT_KEY: Final = f"{names.DOMAIN}/draining"
TAINT_VALUE: Final = "repack"


def taint() -> dict[str, Any]:
    return {"key": TAINT_KEY, "value": TAINT_VALUE, "effect": "NoSchedule"}


def get(node: str) -> Request:
    return Request("GET", paths.node(node))


def change(node: Mapping[str, Any], *, draining: bool) -> Request | None:
    """The patch that adds (or removes) the draining taint on `node` as read; None when nothing changes."""
    meta = as_object(node.get("metadata"))
    have = [dict(as_object(t)) for t in as_list(as_object(node.get("spec")).get("taints"))]
    others = [t for t in have if t.get("key") != TAINT_KEY]
    want = [*others, taint()] if draining else others
    if want == have:
        return None
    body = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "spec": {"taints": want or None}}
    return Request("PATCH", paths.node(str(meta.get("name") or "")), body, content_type=calls.MERGE_PATCH)
