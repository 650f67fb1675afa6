"""`gpupack top` and `gpupack explain` against the real apiserver, with pods the real scheduler and our
extender placed."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

from test_extender import MODEL, POOL, create_gpunodes, extender, gpu_pod, outcome, setup

from app.core import names
from app.kube.client import Kube
from tests.devcluster import Cluster, wait_for

__all__ = ["extender", "setup"]  # fixtures shared with test_extender

Run = Callable[..., subprocess.CompletedProcess[str]]


def test_top_and_explain_on_a_real_cluster(  # noqa: PLR0917  (pytest fixtures)
    cluster: Cluster,
    extender: Callable[..., str],
    setup: Kube,
    core: Any,
    namespace: str,
    gpu_nodes: Any,
    run_gpupack: Run,
) -> None:
    n0, n1 = gpu_nodes(2, gpus_per_node=2, model=MODEL, labels={POOL: namespace})
    (other,) = gpu_nodes(1, gpus_per_node=2, model=MODEL, labels={POOL: f"{namespace}-other"})
    create_gpunodes(setup, [n0, n1, other], 2)
    extender("binpack")
    for name, milli in (("big", 810), ("small", 810), ("quarter", 250)):
        core.create_namespaced_pod(namespace, gpu_pod(name, namespace, namespace, milli=milli))
        wait_for(lambda name=name: outcome(core, namespace, name), 30, f"{name} bound")
    wanted = gpu_pod("v100", namespace, namespace, milli=500)
    wanted["metadata"]["annotations"][names.GPU_MODEL] = "V100M16"
    core.create_namespaced_pod(namespace, wanted)
    wait_for(lambda: outcome(core, namespace, "v100") == "unschedulable", 30, "v100 refused")
    env = {**os.environ}
    kubeconfig = ("--kubeconfig", str(cluster.kubeconfig))

    top = run_gpupack("top", "--node", n0, *kubeconfig, env=env)
    assert top.returncode == 0, top.stderr
    print(top.stdout)
    lines = top.stdout.splitlines()
    gpu_lines = [line for line in lines[1:] if line.startswith(n0)]
    assert [line.split()[1] for line in gpu_lines] == ["0", "1"]
    # binpack: the two 0.81 pods on n0's two GPUs, the quarter on n1; typical request 0.81
    assert f"{n0}: 1.62 of 2 GPUs allocated, 0 free, fragmented 0.38" in top.stdout
    assert n1 not in top.stdout
    everything = run_gpupack("top", "--namespace", namespace, *kubeconfig, env=env)
    assert everything.returncode == 0, everything.stderr
    # only the namespace's pods count: its share of each node, no free or fragmented GPUs (the cluster's)
    assert f"{n1}: 0.25 of 2 GPUs allocated to {namespace}" in everything.stdout
    assert f"{n0}: 1.62 of 2 GPUs allocated to {namespace}" in everything.stdout
    assert other not in everything.stdout  # it holds no pod of the namespace
    bad = run_gpupack("top", "--node", "no-such-node", *kubeconfig, env=env)
    assert bad.returncode == 1 and "--node='no-such-node': must name a GPUNode" in bad.stderr

    flags = ("--policy", "binpack", "--heartbeat-timeout", "86400", *kubeconfig)
    got = run_gpupack("explain", f"{namespace}/v100", "--json", *flags, env=env)
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    rows = {r["node"]: r for r in doc["nodes"]}
    assert doc["choice"] is None and doc["boundTo"] is None
    for n in (n0, n1):
        assert rows[n]["kind"] == "model"
        assert {g["reason"] for g in rows[n]["gpus"]} == {f"GPU model {MODEL} is not one of V100M16"}
    assert (
        rows[other]["reason"]
        == "the pod's nodeSelector or required node affinity does not match the node's labels"
    )
    text = run_gpupack("explain", f"{namespace}/quarter", *flags, env=env)
    assert text.returncode == 0, text.stderr
    print(text.stdout)
    assert f"bound to {n1}, GPU 0" in text.stdout
    # without its own share, the quarter still goes to n1/gpu0 (n0's holes are 0.19)
    assert f"placed now it would go to {n1}, GPU 0" in text.stdout
    assert "needs 0.25 of the GPU: 0.19 free" in text.stdout
    missing = run_gpupack("explain", f"{namespace}/nope", *flags, env=env)
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"gpupack explain: pod {namespace}/nope not found"
