"""Compat tier: KAI-Scheduler's and HAMi's documented pods through a real control plane with gpupack wired in.

Every test here is marked `integration` (it needs the Kubernetes binaries, like tests/integration). The
function-scoped fixtures `namespace` and `gpu_nodes` are tests/integration's own, loaded from its conftest;
the control plane is this package's (package scope, so it is stopped before tests/integration starts its
session one: never two at once), and the gpupack components are started once for the package:

  gpupack    (package)  webhook (--hami-takeover, registered with the chart's MutatingWebhookConfiguration
                        rendered with webhook.hamiTakeover=true), extender (binpack) where kube-scheduler
                        calls it, the chart's RBAC and pod-allocation ValidatingAdmissionPolicy, one
                        kwok node with GPUS simulated T4s and its agent. Yields the node name.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.utils import parse_quantity

from app.core import names
from tests.devcluster import (
    GPUPACK_NAMESPACE,
    Cluster,
    ComponentSpec,
    HealthCheck,
    wait_for,
)
from tests.devcluster.addons import (
    CRD_RELPATH,
    MANIFEST_RELPATH,
    install_crd,
    install_policies,
    install_rbac,
    policy_objects,
    rbac_objects,
    wait_for_pod_policy,
)
from tests.devcluster.admission import webhook_configuration

HERE = Path(__file__).parent
REPO = HERE.parents[1]
MODEL = "T4"
GPUS = 8
for extra in ("tests/integration", "tests/helm"):  # simagents, render (helm)
    if str(REPO / extra) not in sys.path:
        sys.path.insert(0, str(REPO / extra))

import render  # noqa: E402
from controlplane import attach_log_tails, running_cluster  # noqa: E402
from simagents import SimAgents, write_sim  # noqa: E402


def _integration_fixtures() -> Any:
    spec = importlib.util.spec_from_file_location(
        "gpupack_integration_fixtures", REPO / "tests/integration/conftest.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_shared = _integration_fixtures()
namespace = _shared.namespace
gpu_nodes = _shared.gpu_nodes
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


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from running_cluster(tmp_path_factory, "compat-cluster", "compat tier", _active)


@pytest.fixture(scope="package")
def kube(cluster: Cluster) -> Iterator[Any]:
    with cluster.api_client() as api:
        yield api


@pytest.fixture(scope="package")
def core(kube: Any) -> Any:
    return client.CoreV1Api(kube)


def chart_webhook_configuration(*sets: str) -> dict[str, Any]:
    """The chart's MutatingWebhookConfiguration as `helm template` renders it with `sets`."""
    helm = render.helm_binary()
    out = render.helm_template(helm, sets=("webhook.certs.mode=certManager", *sets))
    (mwc,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "MutatingWebhookConfiguration"]
    return dict(mwc)


@pytest.fixture(scope="package")
def gpupack(
    cluster: Cluster, kube: Any, core: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    docs = list(yaml.safe_load_all((REPO / MANIFEST_RELPATH).read_text()))
    install_crd(kube, yaml.safe_load((REPO / CRD_RELPATH).read_text()))
    install_rbac(kube, rbac_objects(docs, components=("extender", "agent")))
    # The pod-allocation policy (the agent's own-node one needs pod-bound tokens, which sim agents lack).
    install_policies(kube, policy_objects(docs, components=("extender",)))
    wait_for_pod_policy(kube, "default")
    py = sys.executable
    ext_argv = (
        py, "-m", "app.cli", "extender", "serve",
        "--kubeconfig", str(cluster.kubeconfig_for("gpupack-extender")),
        "--host", "127.0.0.1", "--port", str(cluster.extender_port), *cluster.extender_tls_flags(),
        "--policy", "binpack", "--lease-namespace", GPUPACK_NAMESPACE, "--lease-duration", "3",
    )  # fmt: skip
    hook_argv = (
        py, "-m", "app.cli", "webhook", "serve",
        "--cert", str(cluster.webhook_cert_file), "--key", str(cluster.webhook_key_file),
        "--host", "127.0.0.1", "--port", str(cluster.webhook_port), "--hami-takeover",
    )  # fmt: skip
    cluster.start_process(
        ComponentSpec(
            "gpupack-extender",
            ext_argv,
            health=HealthCheck(f"http://127.0.0.1:{cluster.extender_ops_port}/readyz"),
            ready_timeout_s=90,
        )
    )
    cluster.start_process(
        ComponentSpec(
            "gpupack-webhook",
            hook_argv,
            health=HealthCheck(
                f"https://127.0.0.1:{cluster.webhook_port}/readyz", ca_file=str(cluster.ca_file)
            ),
            ready_timeout_s=60,
        )
    )
    admission = client.AdmissionregistrationV1Api(kube)
    body = webhook_configuration(
        chart_webhook_configuration("webhook.hamiTakeover=true"),
        cluster.ca_bundle,
        f"https://127.0.0.1:{cluster.webhook_port}/mutate",
    )
    admission.create_mutating_webhook_configuration(body)
    (node,) = cluster.create_gpu_nodes(1, GPUS, MODEL, prefix="compat-gpu-")
    agents = SimAgents(cluster, tmp_path_factory.mktemp("compat-agents"), 2, extra_args=("--no-mps",))
    write_sim(agents.sim(node), [{"model": MODEL} for _ in range(GPUS)])
    agents.start(node)
    try:
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe", "annotations": {names.GPU_FRACTION: "0.5"}},
            "spec": {"containers": [{"name": "main", "image": "cuda"}]},
        }

        def in_effect() -> bool:  # the configuration reaches the admission chain asynchronously
            created = core.create_namespaced_pod("default", probe, dry_run="All")
            return (created.metadata.labels or {}).get(names.LABEL_MANAGED) == "true"

        wait_for(in_effect, 60, "gpupack webhook mutating a dry-run pod create")

        def advertised() -> bool:
            status = core.read_node(node).status
            have = parse_quantity((status.allocatable or {}).get(names.RESOURCE_GPU_MILLI, "0"))
            return bool(have == GPUS * 1000)

        wait_for(advertised, 60, f"{node} advertising {names.RESOURCE_GPU_MILLI}")
        yield node
    finally:
        agents.stop_all()
        admission.delete_mutating_webhook_configuration(body["metadata"]["name"])
        cluster.stop_process("gpupack-webhook")
        cluster.stop_process("gpupack-extender")
        core.delete_node(node)
