"""The annotations that keep autoscalers from evicting a gpupack pod on their own guess (pure).

Karpenter and cluster-autoscaler simulate kube-scheduler without its extenders: when they consolidate a
node they would move a share to wherever node-level gpupack.io/* resources add up, which says nothing about
whether one GPU there has room. So every gpupack pod opts out of their voluntary disruption
(`karpenter.sh/do-not-disrupt`, `cluster-autoscaler.kubernetes.io/safe-to-evict`); `gpupack repack` moves
shares with the placement engine and within PodDisruptionBudgets, and then the autoscaler removes the
nodes it emptied. A value the pod already carries is the owner's choice and is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from app.core.jsonpointer import pointer

KARPENTER_DO_NOT_DISRUPT: Final = "karpenter.sh/do-not-disrupt"
CA_SAFE_TO_EVICT: Final = "cluster-autoscaler.kubernetes.io/safe-to-evict"
ANNOTATIONS: Final = {KARPENTER_DO_NOT_DISRUPT: "true", CA_SAFE_TO_EVICT: "false"}


def annotation_ops(have: Mapping[str, str]) -> list[dict[str, Any]]:
    """JSONPatch ops adding each autoscaler annotation the pod (its annotations: `have`) does not set."""
    if not have:
        return [{"op": "add", "path": "/metadata/annotations", "value": dict(ANNOTATIONS)}]
    return [
        {"op": "add", "path": "/metadata/annotations" + pointer(key), "value": value}
        for key, value in ANNOTATIONS.items()
        if key not in have
    ]
