"""`gpupack top` filters and fragmented share; `gpupack explain` rows per node and GPU (pure)."""

from __future__ import annotations

import argparse

import pytest

from app.core import explain
from app.core.fragmentation import fragmented_milli
from app.core.model import ClusterState, Demand, Gpu, Node
from app.core.placement import registry
from app.tools.explain_command import _pod_key, scheduler_exclusions
from app.tools.explain_command import render as render_explain
from app.tools.top import render


def cluster() -> ClusterState:
    def node(name: str, used: tuple[int, ...]) -> Node:
        gpus = tuple(
            Gpu(i, "A100-40GB", 40960, milli_used=m, memory_used_mib=m * 40) for i, m in enumerate(used)
        )
        return Node(name, gpus)

    return ClusterState({"n0": node("n0", (810, 810, 0)), "n1": node("n1", (250, 0, 0))})


PODS = {("n0", 0): ["a/x"], ("n0", 1): ["b/y"], ("n1", 0): ["a/z"]}


def test_fragmented_share_per_node_and_in_total() -> None:
    out = render(cluster(), PODS, typical=250)
    assert "n0: 1.62 of 3 GPUs allocated, 1 free, fragmented 0.38" in out  # two 0.19 holes < 0.25
    assert "n1: 0.25 of 3 GPUs allocated, 2 free, fragmented 0.00" in out  # 0.75 free fits a 0.25
    assert "6 GPUs: 1.87 allocated, 3 in use, 3 free; packing efficiency 62.3%; fragmented 0.38 GPUs" in out
    assert fragmented_milli(cluster().nodes["n0"].gpus, 190) == 0  # a 0.19 request fits each hole


def test_node_and_namespace_filters() -> None:
    only_n1 = render(cluster(), PODS, typical=250, nodes={"n1"})
    assert "n0" not in only_n1
    assert only_n1.endswith("(free share on GPUs in use below the typical 0.25 request)")
    ns_a = render(cluster(), PODS, typical=250, namespace="a").splitlines()
    gpu_lines = [line for line in ns_a[1:-1] if line[:20].strip()]
    assert [(line.split()[0], line.split()[1]) for line in gpu_lines] == [("n0", "0"), ("n1", "0")]
    assert "2 GPUs" not in ns_a[-1] and ns_a[-1].startswith("6 GPUs")


def test_explain_rows_per_gpu_and_scheduler_exclusions() -> None:
    st = cluster()
    doc = explain.explain(
        {"n0": st.nodes["n0"], "n1": st.nodes["n1"], "gone": None},
        Demand(1, milli=250),
        registry.create("binpack"),
        excluded={"n1": "cordoned (spec.unschedulable)"},
    )
    assert doc["choice"] == {"node": "n0", "gpus": [2]}  # n1 would be fuller but kube-scheduler drops it
    rows = {r["node"]: r for r in doc["nodes"]}
    assert rows["n1"] == {
        "node": "n1",
        "fits": False,
        "reason": "cordoned (spec.unschedulable)",
        "kind": "scheduler",
    }
    assert rows["gone"]["reason"] == explain.NO_GPUNODE
    gpus = rows["n0"]["gpus"]
    assert [g["fits"] for g in gpus] == [False, False, True]
    assert gpus[0]["reason"] == "needs 0.25 of the GPU: 0.19 free"
    text = render_explain("a/p", {**doc, "boundTo": None, "allocation": None})
    assert "placed now it would go to n0, GPU 2" in text
    assert "  gpu0" in text and "needs 0.25 of the GPU: 0.19 free" in text


def test_explain_of_a_bound_pod_says_how_much_memory_it_can_allocate() -> None:
    """docs/node-side.md, "Memory a share can use": the limit includes the CUDA context (514 MiB measured)."""
    st = cluster()
    doc = explain.explain({"n0": st.nodes["n0"]}, Demand(1, memory_mib=2048), registry.create("binpack"))
    alloc = {"gpupack.io/gpu-indexes": "2", "gpupack.io/memory-limit-mib": "2048"}
    text = render_explain("a/p", {**doc, "boundTo": "n0", "allocation": alloc})
    assert "GPU memory per GPU: limit 2048 MiB; about 1534 MiB for allocations" in text


def test_explain_model_and_memory_reasons() -> None:
    g = Gpu(0, "T4", 15109, milli_used=0)
    assert explain.gpu_misfit(g, Demand(1, milli=100, models=frozenset({"A100-40GB"}))) == (
        "GPU model T4 is not one of A100-40GB"
    )
    assert explain.gpu_misfit(g, Demand(1, memory_mib=20000)).startswith("needs 1.324 of the GPU")
    assert explain.gpu_misfit(Gpu(0, "T4", 15109, healthy=False), Demand(1, milli=100)) == "unhealthy"


def test_scheduler_exclusions_and_pod_key() -> None:
    pod = {"spec": {"nodeSelector": {"pool": "a"}}}
    nodes = [
        {"metadata": {"name": "in", "labels": {"pool": "a"}}},
        {"metadata": {"name": "out", "labels": {"pool": "b"}}},
        {"metadata": {"name": "off", "labels": {"pool": "a"}}, "spec": {"unschedulable": True}},
    ]
    assert scheduler_exclusions(pod, nodes) == {
        "out": "the pod's nodeSelector or required node affinity does not match the node's labels",
        "off": "cordoned (spec.unschedulable)",
    }
    # a GPUNode whose Node is gone is never offered by kube-scheduler
    assert scheduler_exclusions(pod, nodes, ["in", "gone"]) == {
        "out": "the pod's nodeSelector or required node affinity does not match the node's labels",
        "off": "cordoned (spec.unschedulable)",
        "gone": "no Node object of that name (only its GPUNode is left)",
    }
    assert _pod_key("ns/p") == "ns/p"
    with pytest.raises(argparse.ArgumentTypeError, match="POD='p': must be NAMESPACE/NAME"):
        _pod_key("p")
