"""Placeholder pods: their body, reading them back, and reconciling them with the plan."""

from __future__ import annotations

from app.core import names
from app.core.autoscale import placeholders as ph
from app.core.autoscale.plan import Pool, Request

A100 = Pool("A100-80GB", 8)
H100 = Pool("H100-80GB", 8)


def req(pool: Pool, gpus: int, *pods: str) -> Request:
    return Request(pool, gpus, pods or ("ns/p",))


def listed(name: str, pool: Pool, gpus: int, node: str = "", deleting: bool = False) -> dict[str, object]:
    body = ph.body(req(pool, gpus), "gpupack-system")
    meta = dict(body["metadata"])
    meta["name"] = name
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {**body, "metadata": meta, "spec": {**body["spec"], "nodeName": node}}


def test_body_asks_for_whole_gpus_of_the_model_outside_tenant_quota() -> None:
    body = ph.body(req(A100, 3, "team-a/x", "team-b/y"), "gpupack-system", resource="nvidia.com/gpu")
    container = body["spec"]["containers"][0]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "3"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "3"}
    assert not any(r.startswith(names.RESOURCE_PREFIX) for r in container["resources"]["requests"])
    assert body["metadata"]["namespace"] == "gpupack-system"
    assert body["spec"]["nodeSelector"] == {names.NODE_LABEL_GPU_MODEL: "A100-80GB"}
    assert body["spec"]["priorityClassName"] == ph.PRIORITY_CLASS
    assert body["metadata"]["annotations"][ph.ANNOTATION_FOR] == "team-a/x,team-b/y"


def test_priority_preempted_by_default_pods_but_not_expendable_for_cluster_autoscaler() -> None:
    value = ph.priority_class()["value"]
    assert -10 <= value < 0  # CA ignores pods below -10 (--expendable-pods-priority-cutoff)


def test_read_round_trip_and_ignores_others() -> None:
    assert ph.read(listed("a", A100, 2, node="n1")) == ph.Placeholder("a", "A100-80GB", 2, "n1")
    assert ph.read(listed("a", A100, 2, deleting=True)) is None
    assert ph.read({"metadata": {"name": "x", "labels": {"app": "y"}}}) is None
    assert (
        ph.read({"metadata": {"name": "x", "labels": {ph.LABEL_PLACEHOLDER: "true", ph.LABEL_GPUS: "two"}}})
        is None
    )


def test_reconcile_creates_what_is_missing_only() -> None:
    have = [ph.Placeholder("a", "A100-80GB", 8, "")]
    got = ph.reconcile(have, [req(A100, 8), req(A100, 3), req(H100, 1)])
    assert [(r.pool.model, r.gpus) for r in got.create] == [("A100-80GB", 3), ("H100-80GB", 1)]
    assert got.delete == ()


def test_reconcile_is_stable_when_the_plan_does_not_change() -> None:
    have = [ph.Placeholder("a", "A100-80GB", 8, ""), ph.Placeholder("b", "A100-80GB", 3, "n9")]
    got = ph.reconcile(have, [req(A100, 3), req(A100, 8)])
    assert got.create == () and got.delete == ()


def test_reconcile_withdraws_everything_once_nothing_is_wanted() -> None:
    have = [ph.Placeholder("a", "A100-80GB", 8, ""), ph.Placeholder("b", "H100-80GB", 1, "n2")]
    assert ph.reconcile(have, []).delete == ("a", "b")


def test_reconcile_withdraws_bound_ones_first() -> None:
    have = [
        ph.Placeholder("pending", "A100-80GB", 2, ""),
        ph.Placeholder("bound", "A100-80GB", 2, "n1"),
    ]
    got = ph.reconcile(have, [req(A100, 2)])
    assert got.delete == ("bound",) and got.create == ()


def test_reconcile_replaces_a_changed_shape() -> None:
    have = [ph.Placeholder("a", "A100-80GB", 2, "")]
    got = ph.reconcile(have, [req(A100, 3)])
    assert got.delete == ("a",) and [r.gpus for r in got.create] == [3]


def test_a_placeholder_on_a_node_whose_gpus_are_published_never_stands_for_new_capacity() -> None:
    """Its node's GPUs are in the plan already: the same shape wanted again means another node."""
    have = [ph.Placeholder("arrived", "A100-80GB", 8, "n1"), ph.Placeholder("coming", "A100-80GB", 2, "n2")]
    got = ph.reconcile(have, [req(A100, 8), req(A100, 2)], published={"n1"})
    assert got.delete == ("arrived",)
    assert [(r.pool.model, r.gpus) for r in got.create] == [("A100-80GB", 8)]


def test_a_placeholder_only_binds_where_gpupack_does_not_run_yet() -> None:
    terms = ph.body(req(A100, 2), "gpupack-system")["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": names.NODE_LABEL_ENABLED, "operator": "DoesNotExist"}]}]


def test_placeholders_never_share_a_node() -> None:
    """Each stands for one imagined node; two on one node would hide a node the plan asked for."""
    spec = ph.body(req(A100, 2), "gpupack-system")
    (term,) = spec["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {
        "labelSelector": {"matchLabels": {ph.LABEL_PLACEHOLDER: "true"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    assert spec["metadata"]["labels"][ph.LABEL_PLACEHOLDER] == "true"  # the term selects placeholders too


def test_a_placeholder_whose_node_the_plan_awaits_is_kept_whatever_its_shape() -> None:
    have = [ph.Placeholder("waiting", "A100-80GB", 3, ""), ph.Placeholder("unneeded", "A100-80GB", 2, "")]
    got = ph.reconcile(have, [req(A100, 5)], awaited={"waiting"})
    assert got.delete == ("unneeded",)
    assert [r.gpus for r in got.create] == [5]
