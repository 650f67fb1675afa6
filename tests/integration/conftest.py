"""Integration tier: one real control plane per test session, shared by every tests/integration/test_*.py.

Every test collected under tests/integration/ is marked `integration` automatically.

Fixtures
  cluster    (session)  tests.devcluster.Cluster running etcd, kube-apiserver (own CA, RBAC, static tokens),
                        kube-controller-manager (every default controller: Deployments/ReplicaSets/Jobs make
                        pods, namespaces are finalized, ResourceQuota and PDB status computed, garbage
                        collection, ServiceAccount tokens), kube-scheduler
                        (deploy/scheduler/kube-scheduler-config.yaml, extender at cluster.extender_url -
                        nothing listens there until a test starts one) and kwok. The ServiceAccount and
                        TaintNodesByCondition admission plugins stay off (see components.apiserver).
    To start gpupack components against it:
      cluster.kubeconfig, kubeconfig_for(identity), token(identity), api_client(identity) - identities:
        admin, scheduler, controller-manager, kwok, gpupack-extender, gpupack-webhook, gpupack-agent, tenant
        (the gpupack ones authenticate as ServiceAccounts gpupack-system/<name>; they have no RBAC until a
        test grants it)
      cluster.api_url, ca_file, ca_bundle (base64, for a webhook's caBundle)
      cluster.extender_port, webhook_port, webhook_cert_file, webhook_key_file (SAN IP:127.0.0.1)
      the extender is called over mutual TLS: cluster.extender_tls_flags() (serve flags: TLS files and
        --ops-port), extender_opener() (a urllib opener presenting the scheduler's client certificate),
        extender_ops_port (plain HTTP /healthz, /readyz, /metrics)
      cluster.start_process(ComponentSpec(name, argv, health=HealthCheck(url, ca_file=...), env=...))
        -> ManagedProcess, healthy on return, output in cluster.log_path(name); cluster.stop_process(name).
        Whatever is still running is stopped at session end.
  kube       (session)  kubernetes ApiClient as admin.
  core       (session)  CoreV1Api as admin.
  namespace  (function) a fresh namespace name; afterwards its pods are force-deleted and the namespace is
                        deleted (the namespace controller then removes what is left; nobody waits for it).
  gpu_nodes  (function) factory gpu_nodes(count, gpus_per_node=8, model="A100-40GB", labels=None) -> names;
                        creates kwok GPU nodes (unique names), waits until Ready, deletes them afterwards.
  gpunode_crd (session) the GPUNode CRD from deploy/crds, created (an existing one is kept) and Established.
  run_gpupack (session) run_gpupack(*args, env=..., timeout=300) -> CompletedProcess: `gpupack ARGS` as the
                        console script runs it (this interpreter, from the repo), output captured, no check.
  run_devcluster (session) run_devcluster(*args, env=..., timeout=300) -> CompletedProcess: `python -m
                        tests.devcluster ARGS` (what `make dev|down|status` run), output captured, no check.
Helpers: `from tests.devcluster import wait_for, node_body, ComponentSpec, HealthCheck` (wait_for polls with
a deadline and names what it waited for); `from tests.devcluster.addons import install_crd, install_rbac`
(create, an existing object is kept; install_crd waits until Established). Binaries: $GPUPACK_K8S_BIN or
tests/k8s/build.sh; if neither works the session FAILS (never skips). A failed test's report carries the
tail of every component log.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import attach_log_tails, running_cluster
from kubernetes import client

from tests.devcluster import Cluster
from tests.devcluster.addons import CRD_RELPATH, gpupack_cli, install_crd

HERE = Path(__file__).parent
REPO = HERE.parents[1]
_active: list[Cluster] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    attach_log_tails(report, item, HERE, _active)
    return report


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from running_cluster(tmp_path_factory, "devcluster", "integration tier", _active)


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Iterator[Any]:
    with cluster.api_client() as api:
        yield api


@pytest.fixture(scope="session")
def core(kube: Any) -> Any:
    return client.CoreV1Api(kube)


@pytest.fixture
def namespace(core: Any) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core.delete_namespace(name)


@pytest.fixture
def gpu_nodes(cluster: Cluster, core: Any) -> Iterator[Callable[..., list[str]]]:
    created: list[str] = []

    def make(
        count: int, gpus_per_node: int = 8, model: str = "A100-40GB", labels: dict[str, str] | None = None
    ) -> list[str]:
        names = cluster.create_gpu_nodes(
            count, gpus_per_node, model, prefix=f"gpu-{uuid.uuid4().hex[:6]}-", labels=labels
        )
        created.extend(names)
        return names

    yield make
    for name in created:
        core.delete_node(name)


@pytest.fixture(scope="session")
def gpunode_crd(kube: Any) -> None:
    install_crd(kube, yaml.safe_load((REPO / CRD_RELPATH).read_text()))


def _runner(*prefix: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `prefix + args` from the repository root, output captured, never raising on its exit status."""

    def run(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            (*prefix, *args), cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    return run


@pytest.fixture(scope="session")
def run_gpupack() -> Callable[..., subprocess.CompletedProcess[str]]:
    return _runner(*gpupack_cli())


@pytest.fixture(scope="session")
def run_devcluster() -> Callable[..., subprocess.CompletedProcess[str]]:
    return _runner(sys.executable, "-m", "tests.devcluster")
