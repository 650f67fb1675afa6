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
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.kube.client import Kube
from tests.devcluster import BinariesError, Cluster, ensure_binaries, kubeletnode, wait_for
from tests.devcluster.addons import wait_for_gpunodes

from . import chart

HERE = Path(__file__).parent
REPO = HERE.parents[1]
MODEL = "A100-40GB"
GPUS = 2
INSTALL_TIMEOUT_S = 180
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
    cluster_dir = tmp_path_factory.mktemp("realnode")
    try:  # held until the fixture ends (or the process does): one real node per machine
        lock = kubeletnode.claim_machine(cluster_dir, wait=True)
    except kubeletnode.RealNodeError as exc:
        pytest.fail(str(exc), pytrace=False)
    cluster = Cluster.prepare(cluster_dir, bins)
    cluster.meta["service_accounts"] = True
    node = kubeletnode.RealNode.of(cluster)
    try:
        cluster.start()
        _active.append(cluster)
        kubeletnode.start(cluster, node)
        t0 = time.monotonic()
        image = chart.build_image(cluster.dir / "gpupack-image.tar")
        kube = Kube.connect(str(cluster.kubeconfig))
        try:
            chart.prepare(kube, cluster, node, cluster.dir / "gpupack-image.tar")
            doc = chart.values(cluster, node, image, MODEL, GPUS)
            chart.helm(helm_bin, cluster, "install", chart.RELEASE, str(chart.CHART), values_doc=doc)
            chart.start_extender_relay(cluster)
            wait_for(lambda: chart.installed(kube), INSTALL_TIMEOUT_S, "chart components Ready", interval=1)
            with cluster.api_client() as api:
                wait_for_gpunodes(api, [node.name], timeout_s=60)
        finally:
            kube.close()
        print(f"\nimage + helm install + Ready: {time.monotonic() - t0:.0f}s", file=sys.stderr)
        yield cluster, node
    finally:
        if cluster in _active:
            _active.remove(cluster)
        try:
            if any(p.name == "kube-apiserver" for p in cluster.processes):
                chart.uninstall_if_installed(helm_bin, cluster)
        finally:
            try:
                kubeletnode.stop(cluster, node)  # raises RealNodeError naming anything left behind
            finally:
                cluster.stop()
                os.close(lock)
