"""`gpupack top` filters and fragmented share; `gpupack explain` rows per node and GPU (pure)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from app.core import explain
from app.core.errors import KubeError
from app.core.fragmentation import fragmented_milli, typical_milli
from app.core.model import Allocation, ClusterState, Demand, Gpu, Node, mig_index
from app.core.placement import registry
from app.kube.calls import Request
from app.kube.client import Kube, current_namespace
from app.tools.explain_command import _pod_key, missing_models, missing_pod, scheduler_exclusions
from app.tools.explain_command import render as render_explain
from app.tools.top import namespace_share, render


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


def test_namespace_view_counts_only_that_namespaces_pods() -> None:
    """`top --namespace a`: a's pods' share of each GPU, not every pod's (a 0.5 pod beside others on a full
    node reads 0.50, not the node's 7.00)."""
    allocations = {
        "x": Allocation("n0", (0,), ("G0",), milli=500, memory_mib=20480),
        "y": Allocation("n0", (0, 1), ("G0", "G1"), milli=250, memory_mib=10240),
        "z": Allocation("n1", (0,), ("G2",), milli=250, memory_mib=10240),
        "hold": Allocation("n1", (1,), ("G3",), milli=1000, memory_mib=40960),  # its pod is gone
    }
    owners = {"x": "a", "y": "b", "z": "a"}
    state = namespace_share(cluster(), allocations, owners, "a")
    assert [(g.milli_used, g.memory_used_mib) for g in state.nodes["n0"].gpus] == [
        (500, 20480),
        (0, 0),
        (0, 0),
    ]
    assert [(g.milli_used, g.memory_used_mib) for g in state.nodes["n1"].gpus] == [
        (250, 10240),
        (0, 0),
        (0, 0),
    ]
    out = render(state, PODS, typical=250, namespace="a").splitlines()
    gpu_lines = [line.split() for line in out[1:-1] if line[:20].strip()]
    assert [(cols[0], cols[1], cols[4], cols[6]) for cols in gpu_lines] == [
        ("n0", "0", "0.50", "1"),
        ("n1", "0", "0.25", "1"),
    ]
    assert any(line.endswith("n0: 0.50 of 3 GPUs allocated to a") for line in out)
    assert out[-1] == "a: 0.75 GPUs allocated, on 2 of 6 GPUs"
    nothing = render(namespace_share(cluster(), allocations, owners, "c"), PODS, namespace="c")
    assert nothing.splitlines()[-1] == "c: no GPU"


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
    nodes: list[dict[str, Any]] = [
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
    assert _pod_key("ns/p") == ("ns", "p")
    assert _pod_key("train-0.worker") == (None, "train-0.worker")  # the kubeconfig's namespace


@pytest.mark.parametrize("bad", ["a/b/c", "NS/p", "ns/", "/p", "p q", ""])
def test_pod_key_refuses_what_cannot_name_a_pod(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be POD or NAMESPACE/POD"):
        _pod_key(bad)


class OnePod:
    """A Kube stand-in whose only pod is team-a/plain (not a gpupack pod)."""

    def send(self, req: Request) -> dict[str, Any]:
        if req.method == "GET" and req.path == "/api/v1/namespaces/team-a/pods/plain":
            return {"metadata": {"name": "plain", "namespace": "team-a"}}
        raise KubeError(404, "NotFound", f'pods "{req.path.rsplit("/", 1)[-1]}" not found')


def test_explain_of_a_pod_that_is_not_there_says_not_found() -> None:
    kube = cast(Kube, OnePod())
    assert missing_pod(kube, "team-a", "nope") == "pod team-a/nope not found"
    assert missing_pod(kube, "team-a", "plain") == (
        "pod team-a/plain is not a gpupack pod (no label gpupack.io/managed=true): it asks for no GPU "
        "share, or was created where the gpupack webhook does not run"
    )


def test_current_namespace_is_the_kubeconfig_contexts(tmp_path: Path) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}},
            {"name": "b", "context": {"cluster": "c", "user": "u"}},
        ],
        "current-context": "a",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    assert current_namespace(str(path)) == "team-a"
    path.write_text(yaml.safe_dump({**config, "current-context": "b"}))
    assert current_namespace(str(path)) == "default"


def mig_node() -> Node:
    """GPU 0 whole; GPU 1 in MIG mode with a 3g.40gb device (slot 0, held) and a 1g.10gb one (slot 1)."""
    return Node(
        "m",
        (
            Gpu(0, "A100-80GB", 81920),
            Gpu(mig_index(1, 0), "A100-80GB", 40192, milli_used=1000, memory_used_mib=40192,
                mig_profile="3g.40gb", parent=1),
            Gpu(mig_index(1, 1), "A100-80GB", 9856, mig_profile="1g.10gb", parent=1),
        ),
    )  # fmt: skip


def test_explain_of_a_mig_request_names_devices_as_top_does() -> None:
    demand = Demand(count=1, mig=True, mig_profile="1g.10gb")
    doc = explain.explain({"m": mig_node()}, demand, registry.create("binpack"))
    rows = {g["device"]: (g["fits"], g["reason"]) for g in doc["nodes"][0]["gpus"]}
    assert rows == {
        "0": (False, "a whole GPU: the pod asks for a MIG device, taken whole"),
        "1/0": (False, "MIG profile 3g.40gb: the pod asks for 1g.10gb"),
        "1/1": (True, None),
    }
    doc["boundTo"] = None
    text = render_explain("a/mig", doc)
    assert "pod a/mig: 1 x a MIG device 1g.10gb (any model), policy binpack" in text
    assert "None" not in text
    assert [line.split()[0:3] for line in text.splitlines() if line.startswith("  gpu")] == [
        ["gpu0", "no", "a"],
        ["gpu1/0", "3g.40gb", "no"],
        ["gpu1/1", "1g.10gb", "yes"],
    ]
    assert "placed now it would go to m, GPU 1/1" in text
    # a share never goes to a MIG device, and says so
    share = explain.gpu_misfit(mig_node().gpus[2], Demand(count=1, milli=250))
    assert share == "a MIG device (1g.10gb): taken whole, only by pods asking for MIG"


def test_top_names_mig_devices_and_leaves_them_out_of_the_typical_request() -> None:
    allocations = [
        Allocation("m", (0,), ("G0",), milli=250, memory_mib=20480),
        Allocation("m", (mig_index(1, 0),), ("MIG-0",), milli=1000, memory_mib=40192),
        Allocation("m", (mig_index(1, 1),), ("MIG-1",), milli=1000, memory_mib=9856),
    ]
    assert typical_milli(allocations) == 250
    out = render(ClusterState({"m": mig_node()}), {}, typical=250).splitlines()
    assert [line.split()[1:4] for line in out[1:4]] == [
        ["0", "A100-80GB", "[--------------------]"],
        ["1/0", "A100-80GB", "3g.40gb"],
        ["1/1", "A100-80GB", "1g.10gb"],
    ]


def test_a_model_no_node_has_is_named_not_a_generic_affinity_mismatch() -> None:
    """A typo in gpupack.io/gpu-model (A100-40G) becomes a required affinity no node matches: explain says
    which model each node has and that none has the one asked for."""
    pod = {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "gpupack.io/gpu-model", "operator": "In", "values": ["A100-40G"]}
                                ]
                            }
                        ]
                    }
                }
            }
        }
    }
    nodes: list[dict[str, Any]] = [
        {"metadata": {"name": "a", "labels": {"gpupack.io/gpu-model": "A100-40GB"}}},
        {"metadata": {"name": "t", "labels": {"gpupack.io/gpu-model": "T4"}}},
    ]
    assert scheduler_exclusions(pod, nodes, models={"A100-40G"}) == {
        "a": "GPU model A100-40GB is not one of A100-40G (the pod's gpupack.io/gpu-model)",
        "t": "GPU model T4 is not one of A100-40G (the pod's gpupack.io/gpu-model)",
    }
    assert missing_models({"A100-40G"}, nodes) == (
        "no node has a GPU of model A100-40G (gpupack.io/gpu-model); the GPU nodes' models: A100-40GB, T4"
    )
    assert missing_models({"T4"}, nodes) is None
    # a node the pod's own nodeSelector refuses as well keeps the general reason: the model is not all of it
    pooled = {"spec": {**pod["spec"], "nodeSelector": {"pool": "x"}}}
    assert scheduler_exclusions(pooled, nodes, models={"A100-40G"})["a"] == (
        "the pod's nodeSelector or required node affinity does not match the node's labels"
    )
