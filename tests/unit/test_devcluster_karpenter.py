"""The dev cluster's Karpenter objects and the agent stand-in for nodes it adds (pure parts)."""

from __future__ import annotations

from app.core import names
from tests.devcluster import karpenter as k
from tests.devcluster.nodeagents import owned_anchor_pod, shape, standin_daemonset


def test_instance_type_offers_the_pools_gpus_and_the_pool_selects_it() -> None:
    pool = k.GpuPool("A100-80GB", 8)
    (it,) = k.instance_types([pool])
    assert it["resources"]["nvidia.com/gpu"] == "8"
    body = k.node_pool(pool)
    (req,) = body["spec"]["template"]["spec"]["requirements"]
    assert req == {"key": k.INSTANCE_TYPE_LABEL, "operator": "In", "values": [it["name"]]}
    labels = body["spec"]["template"]["metadata"]["labels"]
    assert labels[names.NODE_LABEL_GPU_MODEL] == "A100-80GB"
    assert names.NODE_LABEL_ENABLED not in labels  # its absence marks a node a placeholder may take
    assert body["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert body["spec"]["limits"] == {"nvidia.com/gpu": str(8 * pool.max_nodes)}


def test_extender_flags_name_the_pool() -> None:
    flags = k.extender_flags(k.GpuPool("A100-80GB", 8))
    assert flags[:2] == ("--autoscale-pool", "A100-80GB:8")


def test_shape_of_an_added_node() -> None:
    node = {
        "metadata": {"name": "n", "labels": {names.NODE_LABEL_GPU_MODEL: "A100-80GB", k.NODEPOOL_LABEL: "p"}},
        "status": {"capacity": {"nvidia.com/gpu": "3"}, "allocatable": {"nvidia.com/gpu": "8"}},
    }
    assert shape(node) == ("A100-80GB", 8)
    assert shape({"metadata": {"labels": {}}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}) is None
    assert shape({**node, "status": {"allocatable": {}}}) is None


def test_anchor_pod_counts_as_a_daemonset_pod_without_being_controlled() -> None:
    (owner,) = owned_anchor_pod("n1", "uid-1")["metadata"]["ownerReferences"]
    assert (owner["apiVersion"], owner["kind"], owner["uid"]) == ("apps/v1", "DaemonSet", "uid-1")
    assert not owner.get("controller")
    ds = standin_daemonset()
    pod_labels = owned_anchor_pod("n1", "uid-1")["metadata"]["labels"]
    selector = ds["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= pod_labels.items()  # never adopted by the DaemonSet controller
