"""Kubernetes label selectors and required node affinity, matched against label maps (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core.objects import as_list, as_object, string_map


def _expression(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key = str(expr.get("key") or "")
    op = str(expr.get("operator") or "")
    values = [str(v) for v in as_list(expr.get("values"))]
    have = labels.get(key)
    if op == "In":
        return have is not None and have in values
    if op == "NotIn":
        return have is None or have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in {"Gt", "Lt"} and have is not None and len(values) == 1:
        try:
            a, b = int(have), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False  # an operator we do not know selects nothing, as the API server would refuse it


def matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: every matchLabels pair and every matchExpressions entry holds.

    An empty selector selects everything (a PodDisruptionBudget's `{}` covers every pod of its namespace).
    """
    if any(labels.get(k) != v for k, v in string_map(selector.get("matchLabels")).items()):
        return False
    return all(_expression(as_object(e), labels) for e in as_list(selector.get("matchExpressions")))


def node_allows(pod_spec: Mapping[str, Any], node_labels: Mapping[str, str]) -> bool:
    """The pod's nodeSelector and required node affinity accept a node with these labels."""
    if any(node_labels.get(k) != v for k, v in string_map(pod_spec.get("nodeSelector")).items()):
        return False
    affinity = as_object(as_object(pod_spec.get("affinity")).get("nodeAffinity"))
    required = as_object(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = as_list(required.get("nodeSelectorTerms"))
    if not terms:
        return True
    # Terms are ORed; the expressions of one term are ANDed.
    return any(
        all(_expression(as_object(e), node_labels) for e in as_list(as_object(t).get("matchExpressions")))
        for t in terms
    )


CORDONED = "cordoned (spec.unschedulable)"
TAINTED = "tainted {key}:{effect}, not tolerated by the pod"
NOT_SELECTED = "the pod's nodeSelector or required node affinity does not match the node's labels"


def scheduler_refusal(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """Why kube-scheduler removes `node` for this pod before asking the extender (cordon, selector,
    required affinity); None when it passes the node on."""
    if as_object(node.get("spec")).get("unschedulable") is True:
        return CORDONED
    for taint in as_list(as_object(node.get("spec")).get("taints")):
        t = as_object(taint)
        if t.get("effect") in {"NoSchedule", "NoExecute"} and not tolerates(pod_spec, t):
            return TAINTED.format(key=t.get("key"), effect=t.get("effect"))
    if not node_allows(pod_spec, string_map(as_object(node.get("metadata")).get("labels"))):
        return NOT_SELECTED
    return None


def tolerates(pod_spec: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether one of the pod's tolerations tolerates `taint` (Kubernetes' matching rules)."""
    for raw in as_list(pod_spec.get("tolerations")):
        tol = as_object(raw)
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        key = tol.get("key") or ""
        if tol.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False
