"""Real-node tier: a dev cluster with one real kubelet + containerd node and gpupack installed by its chart.

Every test here is marked `integration` and `realnode`. It skips only where a real node cannot exist at
all (not root: a bridge, mounts and cgroups need it); a missing piece the project installs (containerd,
runc, CNI plugins, busybox-static, buildah, mmdebstrap: `make deps`; the kubelet: tests/k8s/build.sh;
helm: tests/helm/build.sh) FAILS the tier.

  real_cluster  (package)  control plane with ServiceAccount admission (the chart's pods need their tokens),
                           the real node (kubeletnode.start), the gpupack image built (deploy/image/build.sh)
                           and imported into it, then `helm install` of deploy/helm/gpupack (chart.py says
                           with which values and why); returns once the webhook's 2 replicas are Ready, the
                           extender's 2 run with one leader Ready, the agent is Ready and its GPUNode is
                           published. No kwok nodes: every GPU pod lands on the real node. Teardown
                           uninstalls (if a test has not), stops the node and FAILS if anything of it is left
                           on the machine (mounts, shims, bridge, cgroups, files, its directory).
  helm_bin      (package)  the helm binary.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.kube.client import Kube
from tests.devcluster import BinariesError, Cluster, ensure_binaries, kubeletnode

from . import chart

HERE = Path(__file__).parent
REPO = HERE.parents[1]
MODEL = "A100-40GB"
GPUS = 2
if str(REPO / "tests/integration") not in sys.path:
    sys.path.insert(0, str(REPO / "tests/integration"))

from controlplane import attach_log_tails  # noqa: E402

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
def helm_bin() -> str:
    return chart.helm_binary()


@pytest.fixture(scope="package")
def real_cluster(
    tmp_path_factory: pytest.TempPathFactory, helm_bin: str
) -> Iterator[tuple[Cluster, kubeletnode.RealNode]]:
    if os.geteuid() != 0:
        pytest.skip("the real-node tier needs root (a network bridge, mounts and cgroups for the kubelet)")
    try:
        bins = ensure_binaries()
    except BinariesError as exc:
        pytest.fail(f"the real-node tier needs Kubernetes binaries:\n{exc}", pytrace=False)
    missing = [m for m in kubeletnode.missing_prerequisites(bins) if not m.startswith("root")]
    if missing:
        pytest.fail(
            "the real-node tier needs (make deps installs them): " + "; ".join(missing), pytrace=False
        )

    def track(cluster: Cluster | None) -> None:
        _active.clear()
        _active.extend([cluster] if cluster is not None else [])

    try:
        with chart.real_node_installed(
            tmp_path_factory.mktemp("realnode"), bins, helm_bin, model=MODEL, gpus=GPUS, on_cluster=track
        ) as (cluster, node):
            yield cluster, node
    except kubeletnode.RealNodeError as exc:  # another real node runs, or this one left something behind
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def kube(real_cluster: tuple[Cluster, kubeletnode.RealNode]) -> Iterator[Kube]:
    """A client of the real node's cluster, closed after the test."""
    k = Kube.connect(str(real_cluster[0].kubeconfig))
    yield k
    k.close()
