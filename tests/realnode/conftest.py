"""Real-node tier: a dev cluster with one real kubelet + containerd node, gpupack's components wired in.

Every test here is marked `integration` and `realnode`. It skips only where a real node cannot exist at
all (not root: a bridge, mounts and cgroups need it); a missing piece the project installs (containerd,
runc, CNI plugins, busybox-static: `make deps`; the kubelet: tests/k8s/build.sh) FAILS the tier.

  real_cluster  (package)  control plane + the real node (kubeletnode.start) labelled as a GPU node with
                           GPUS simulated GPUs of MODEL, then the dev addons (CRD, RBAC, policies, extender,
                           webhook, and a simulated agent for the real node); no kwok nodes, so every GPU pod
                           lands on the real node. Teardown stops the node and FAILS if anything of it is
                           left on the machine (mounts, shims, bridge, cgroups, files, its directory).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.devcluster import Cluster, kubeletnode
from app.devcluster.addons import Components, Definitions

HERE = Path(__file__).parent
REPO = HERE.parents[1]
MODEL = "A100-40GB"
GPUS = 2
if str(REPO / "tests/integration") not in sys.path:
    sys.path.insert(0, str(REPO / "tests/integration"))

from controlplane import attach_log_tails, running_cluster  # noqa: E402

_active: list[Cluster] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.realnode)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    attach_log_tails(outcome.get_result(), item, HERE, _active)


@pytest.fixture(scope="package")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, kubeletnode.RealNode]]:
    if os.geteuid() != 0:
        pytest.skip("the real-node tier needs root (a network bridge, mounts and cgroups for the kubelet)")
    for cluster in running_cluster(tmp_path_factory, "realnode", "the real-node tier", _active):
        missing = [m for m in kubeletnode.missing_prerequisites(cluster.bin_dir) if not m.startswith("root")]
        if missing:
            pytest.fail(
                "the real-node tier needs (make deps installs them): " + "; ".join(missing), pytrace=False
            )
        node = kubeletnode.RealNode.of(cluster)
        kubeletnode.start(cluster, node)
        try:
            kubeletnode.as_gpu_node(cluster, node, MODEL, GPUS)
            components = Components(mps_pipe_host_dir=cluster.dir / "mps-pipe")
            for addon in (Definitions(), components):
                addon.start(cluster, [node.name])
            yield cluster, node
        finally:
            kubeletnode.stop(cluster, node)  # raises RealNodeError naming anything left behind
