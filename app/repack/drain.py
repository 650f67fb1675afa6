"""The taint that keeps new shares off the nodes a repack is emptying (request builders, pure).

While `gpupack repack --goal nodes --apply` evicts pods off the nodes its plan frees, those nodes carry
`gpupack.io/draining=repack:NoSchedule`: kube-scheduler drops them before asking the extender, so neither a
replacement nor a new pod takes a share there, and an autoscaler sees nodes on their way out. The taint is
removed when the run ends, however it ends; a node the autoscaler has removed meanwhile is simply gone.
"""

from __future__ import annotations

from typing import Any, Final

from app import names
from app.kube import paths
from app.kube.calls import Request

TAINT_KEY: Final = f"{names.DOMAIN}/draining"
TAINT_VALUE: Final = "repack"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"


def taint() -> dict[str, Any]:
    return {"key": TAINT_KEY, "value": TAINT_VALUE, "effect": "NoSchedule"}


def add(node: str) -> Request:
    """Add (or refresh) the draining taint; other taints stay (Node taints merge on their key)."""
    return Request(
        "PATCH", paths.node(node), {"spec": {"taints": [taint()]}}, content_type=STRATEGIC_MERGE_PATCH
    )


def remove(node: str) -> Request:
    """Remove the draining taint only."""
    body = {"spec": {"taints": [{"key": TAINT_KEY, "$patch": "delete"}]}}
    return Request("PATCH", paths.node(node), body, content_type=STRATEGIC_MERGE_PATCH)
