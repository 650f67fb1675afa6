"""The Helm chart against the real apiserver: lint, render, server-side dry run, RBAC per the apiserver.

And observe: the components and a workload, scraped by a real Prometheus; every dashboard query has data.

helm comes from tests/helm/build.sh (built once into the cache; $GPUPACK_HELM overrides). Every render here
uses a unique release name, so cluster-scoped names never collide with objects other tests create for real.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient

from tests.devcluster import GPUPACK_NAMESPACE, Cluster, ComponentSpec, HealthCheck, wait_for
from tests.devcluster.addons import install_crd
from tests.devcluster.admission import webhook_configuration
from tests.devcluster.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy/helm/gpupack"
KUBE_VERSION = (REPO / "tests/k8s/VERSION").read_text().strip()  # what tests/k8s/build.sh builds

VARIANTS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "helm-certs": ("webhook.certs.mode=helm",),
    "cert-manager+monitoring+evict": (
        "webhook.certs.mode=certManager",
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "agent.evictOnViolation=true",
        "extender.podDisruptionBudget.enabled=true",
    ),
    "default-scheduler+own-secret": (
        "scheduler.mode=default",
        "webhook.certs.mode=secret",
        "webhook.certs.caBundle=Y2E=",
        "agent.runtimeClassName=nvidia",
        "agent.mps.enabled=false",
    ),
}

# Third-party kinds the chart can emit; the test apiserver gets schema-less stand-ins so their
# apiVersion/kind/namespace are checked by the dry run (their own operators validate the rest).
STUB_CRDS = (
    ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
    ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
    ("cert-manager.io", "Issuer", "issuers"),
    ("cert-manager.io", "Certificate", "certificates"),
)


@pytest.fixture(scope="session")
def helm() -> str:
    try:
        out = subprocess.run(
            [str(REPO / "tests/helm/build.sh")], check=True, stdout=subprocess.PIPE, text=True
        ).stdout
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"tests/helm/build.sh failed ({exc.returncode}); see its stderr above", pytrace=False)
    return out.strip().splitlines()[-1]


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, check=False)


def render(helm: str, release: str, namespace: str, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    done = run_helm(helm, *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def release_name() -> str:
    return f"gpupack-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def crds(kube: Any, gpunode_crd: None) -> None:
    """The GPUNode CRD for real, and stand-ins for cert-manager and monitoring kinds.

    `gpunode_crd` creates it from deploy/crds, the file the chart's copy is made from (and checked against).
    """
    for group, kind, plural in STUB_CRDS:
        install_crd(
            kube,
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.{group}"},
                "spec": {
                    "group": group,
                    "scope": "Namespaced",
                    "names": {
                        "kind": kind,
                        "plural": plural,
                        "singular": kind.lower(),
                        "listKind": f"{kind}List",
                    },
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    ],
                },
            },
        )


def test_helm_lint_passes_for_every_variant(helm: str) -> None:
    for name, sets in VARIANTS.items():
        args = ["lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION]
        for s in sets:
            args += ["--set", s]
        done = run_helm(helm, *args)
        assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("webhook.certs.mode=vault",), 'webhook.certs.mode="vault": must be helm, certManager or secret'),
        (("webhook.certs.mode=secret",), "webhook.certs.mode=secret needs webhook.certs.caBundle"),
        (("scheduler.mode=both",), 'scheduler.mode="both": must be second or default'),
    ],
    ids=["bad-cert-mode", "secret-without-ca", "bad-scheduler-mode"],
)
def test_bad_values_fail_with_a_message(helm: str, sets: tuple[str, ...], message: str) -> None:
    args = ["template", "gpupack", str(CHART), "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    done = run_helm(helm, *args)
    assert done.returncode != 0
    assert message in done.stderr


def test_committed_manifests_and_copies_equal_a_fresh_render(helm: str) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "tests/helm/render.py"), "--check"],
        env={"GPUPACK_HELM": helm, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]


def test_helm_mode_puts_its_own_ca_in_the_webhook_configuration(helm: str) -> None:
    objs = render(helm, "gpupack", "gpupack-system", ("webhook.certs.mode=helm",))
    secret = next(o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"] == "gpupack-webhook-tls")
    mwc = next(o for o in objs if o["kind"] == "MutatingWebhookConfiguration")
    assert secret["metadata"]["name"] == "gpupack-webhook-tls"
    # One entry per Pod Security level (deploy/webhook/), each with the same CA.
    assert [w["clientConfig"]["caBundle"] for w in mwc["webhooks"]] == [secret["data"]["ca.crt"]] * 3


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_object_passes_server_side_dry_run(
    helm: str, kube: Any, crds: None, namespace: str, variant: str
) -> None:
    objs = render(helm, release_name(), namespace, VARIANTS[variant])
    dyn = DynamicClient(kube)  # after `crds`, so discovery knows the stand-in kinds
    kinds = set()
    failures = []
    for obj in objs:
        kinds.add(obj["kind"])
        if obj["kind"] == "CustomResourceDefinition":
            continue  # created for real by `crds`, from the same file
        res, ns = resource_of(dyn, obj)
        if res.namespaced:
            assert ns, f"{obj['kind']}/{obj['metadata']['name']} has no namespace"
        try:
            res.create(body=obj, namespace=ns, dry_run="All")
        except Exception as exc:  # the dynamic client wraps ApiException in its own types
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {getattr(exc, 'body', exc)}")
    assert not failures, "\n".join(failures)
    assert {"Deployment", "DaemonSet", "MutatingWebhookConfiguration", "ClusterRole"} <= kinds


# ---- RBAC: what each component's ServiceAccount may and may not do, as the apiserver decides ----

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def resource_of(dyn: DynamicClient, obj: dict[str, Any]) -> tuple[Any, str | None]:
    """The dynamic client's resource for `obj`, and the namespace to use (None when cluster-scoped)."""
    res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    return res, obj["metadata"].get("namespace") if res.namespaced else None


@contextmanager
def created(kube: Any, objs: list[dict[str, Any]], *, keep_existing: bool = False) -> Iterator[None]:
    """`objs` created for real, in order; on exit what was created is deleted, newest first.

    keep_existing: an object that already exists (another test's copy) is left be instead of failing.
    """
    dyn = DynamicClient(kube)
    made = []
    try:
        for obj in objs:
            res, ns = resource_of(dyn, obj)
            try:
                res.create(body=obj, namespace=ns)
            except Exception as exc:  # the dynamic client wraps ApiException in its own types
                if not keep_existing or getattr(exc, "status", None) != 409:
                    raise
                continue
            made.append((res, obj["metadata"]["name"], ns))
        yield
    finally:
        for res, name, ns in reversed(made):
            res.delete(name=name, namespace=ns)


@pytest.fixture
def rbac_release(helm: str, kube: Any, namespace: str) -> Iterator[tuple[str, str]]:
    """The chart's RBAC created for real (unique release, test namespace); removed afterwards."""
    release = release_name()
    with created(kube, [o for o in render(helm, release, namespace) if o["kind"] in RBAC_KINDS]):
        yield release, namespace


def can(kube: Any, user: str, namespace: str, verb: str, resource: str, **attrs: str) -> bool:
    group, _, sub = "", "", ""
    if "/" in resource:
        resource, sub = resource.split("/", 1)
    if "." in resource:
        resource, group = resource.split(".", 1)
    sa_ns = user.split(":")[2]
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{sa_ns}", "system:authenticated"],
            "resourceAttributes": {
                "namespace": namespace,
                "verb": verb,
                "group": group,
                "resource": resource,
                "subresource": sub,
                **attrs,
            },
        },
    }
    out = client.AuthorizationV1Api(kube).create_subject_access_review(review)
    return bool(out.status.allowed)


# (component, verb, resource[.group][/subresource], namespace ("" = cluster / all), name, allowed)
RBAC_CASES = [
    ("extender", "list", "pods", "", "", True),
    ("extender", "watch", "pods", "", "", True),
    ("extender", "patch", "pods", "team-a", "p", True),
    ("extender", "create", "pods/binding", "team-a", "p", True),
    ("extender", "watch", "gpunodes.gpupack.io", "", "", True),
    ("extender", "watch", "resourcequotas", "", "", True),
    ("extender", "update", "resourcequotas", "team-a", "q", False),
    ("extender", "create", "events", "team-a", "", True),
    ("extender", "update", "leases.coordination.k8s.io", "@release", "@release-extender", True),
    ("extender", "create", "leases.coordination.k8s.io", "@release", "", True),
    ("extender", "update", "leases.coordination.k8s.io", "kube-system", "kube-scheduler", False),
    ("extender", "delete", "nodes", "", "n", False),
    ("extender", "delete", "pods", "team-a", "p", False),
    # pods: patch only (the pod-allocation admission policy limits it to the allocation annotations)
    ("extender", "update", "pods", "team-a", "p", False),
    ("extender", "create", "pods", "team-a", "", False),
    ("extender", "patch", "pods/status", "team-a", "p", False),
    ("extender", "patch", "gpunodes.gpupack.io", "", "n", False),
    ("extender", "list", "secrets", "", "", False),
    ("agent", "patch", "nodes", "", "n", True),
    ("agent", "patch", "nodes/status", "", "n", True),
    ("agent", "create", "gpunodes.gpupack.io", "", "", True),
    ("agent", "patch", "gpunodes.gpupack.io/status", "", "n", True),
    ("agent", "list", "pods", "", "", True),
    ("agent", "watch", "pods", "", "", True),  # the node's pods, so a container's create reads no pod
    ("agent", "create", "events", "team-a", "", True),
    ("agent", "create", "pods/binding", "team-a", "p", False),
    # the watchdog (on by default) evicts a pod that keeps putting processes where it may not
    ("agent", "create", "pods/eviction", "team-a", "p", True),
    ("agent", "delete", "nodes", "", "n", False),
    ("agent", "list", "secrets", "", "", False),
    ("webhook", "watch", "gpunodes.gpupack.io", "", "", True),  # the quota charge's GPUs (readGpuNodes)
    ("webhook", "patch", "gpunodes.gpupack.io", "", "n", False),
    ("webhook", "list", "nodes", "", "", False),
    ("webhook", "list", "secrets", "", "", False),
    ("webhook", "get", "pods", "team-a", "p", False),
    ("scheduler", "create", "pods/binding", "team-a", "p", True),
    ("scheduler", "list", "nodes", "", "", True),
    ("scheduler", "list", "persistentvolumeclaims", "", "", True),
    ("scheduler", "update", "leases.coordination.k8s.io", "@release", "gpupack-scheduler", True),
    ("scheduler", "get", "configmaps", "kube-system", "extension-apiserver-authentication", True),
    ("scheduler", "list", "secrets", "", "", False),
    ("scheduler", "delete", "nodes", "", "n", False),
]


def test_rbac_grants_what_each_component_needs_and_refuses_the_rest(
    kube: Any, rbac_release: tuple[str, str]
) -> None:
    release, ns = rbac_release
    wrong = []
    for component, verb, resource, case_ns, name, allowed in RBAC_CASES:
        user = f"system:serviceaccount:{ns}:{release}-{component}"
        where = ns if case_ns == "@release" else case_ns
        attrs = {"name": name.replace("@release", release)} if name else {}
        got = can(kube, user, where, verb, resource, **attrs)
        if got != allowed:
            wrong.append(
                f"{component} {verb} {resource} ns={where!r} name={name!r}: allowed={got}, want {allowed}"
            )
    assert not wrong, "\n".join(wrong)


def test_cluster_fixture_is_the_shared_one(cluster: Cluster) -> None:
    """This module builds no control plane of its own: it runs on the session's."""
    assert cluster.api_url.startswith("https://127.0.0.1:")


# ---- observe: real components and a workload, a real Prometheus; every dashboard query has data ----

DASHBOARD = REPO / "deploy/grafana/gpupack-dashboard.json"
SCRAPE = REPO / "deploy/prometheus/scrape-config.yaml"
# Grafana's variables, as a dashboard viewer would have them on a short range.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__range": "5m"}
OBSERVE_PROCS: list[str] = []


def dashboard_queries() -> list[tuple[str, str]]:
    out = []
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        for t in p.get("targets", []):
            expr = t["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            out.append((p["title"], expr))
    return out


def prometheus_config(extender: str, webhook: str, agents: dict[str, str], ca_file: str) -> dict[str, Any]:
    """deploy/prometheus/scrape-config.yaml's static jobs, pointed at this test's processes."""
    jobs = {j["job_name"]: j for j in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]}
    ext, hook, agent = jobs["gpupack-extender"], jobs["gpupack-webhook"], jobs["gpupack-agent"]
    ext["static_configs"] = [{"targets": [extender]}]
    hook["static_configs"] = [{"targets": [webhook]}]
    hook["tls_config"] = {"ca_file": ca_file}  # the dev CA; the serving cert's SAN is IP:127.0.0.1
    agent["static_configs"] = [{"targets": [addr], "labels": {"node": node}} for node, addr in agents.items()]
    for job in (ext, hook, agent):
        job["scrape_interval"] = "1s"
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [ext, hook, agent],
    }


def prom_query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def sim_file(path: Path, gpus: int, processes: dict[int, list[dict[str, Any]]]) -> None:
    doc = {
        "driver_version": "550.54.15",
        "gpus": [{"model": "A100-40GB", "processes": processes.get(i, [])} for i in range(gpus)],
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    tmp.replace(path)


def share_pod(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


@pytest.fixture
def chart_rbac(helm: str, kube: Any) -> Iterator[None]:
    """The chart's RBAC for the dev identities (ServiceAccounts gpupack-system/gpupack-*), then removed."""
    objs = [o for o in render(helm, "gpupack", GPUPACK_NAMESPACE) if o["kind"] in RBAC_KINDS]
    with created(kube, objs, keep_existing=True):
        yield


def test_every_dashboard_query_returns_data_from_a_real_prometheus(  # noqa: PLR0917 (fixtures)
    cluster: Cluster,
    kube: Any,
    core: Any,
    crds: None,
    chart_rbac: None,
    namespace: str,
    gpu_nodes: Callable[..., list[str]],
    tmp_path: Path,
) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus not installed: .ci/system-deps installs the Debian package"
    gpus = 4
    nodes = gpu_nodes(2, gpus_per_node=gpus, model="A100-40GB")
    py = (sys.executable, "-m", "app.cli")
    agent_ports = dict(zip(nodes, free_ports(len(nodes)), strict=True))
    prom_port = free_ports(1)[0]
    mwc_name = f"deploy-test-{uuid.uuid4().hex[:6]}"
    admission = client.AdmissionregistrationV1Api(kube)
    try:
        for node, port in agent_ports.items():
            sim = tmp_path / f"{node}.yaml"
            sim_file(sim, gpus, {})
            argv: tuple[str, ...] = (
                *py, "agent", "run", "--node", node,
                "--kubeconfig", str(cluster.kubeconfig_for("gpupack-agent")), "--sim", str(sim),
                "--host", "127.0.0.1", "--port", str(port), "--heartbeat", "2s",
                "--interval", "1s", "--min-write-interval", "1s", "--no-mps",
            )  # fmt: skip
            _start(cluster, f"deploy-agent-{node}", argv, f"http://127.0.0.1:{port}/healthz")
        argv = (
            *py, "extender", "serve", "--kubeconfig", str(cluster.kubeconfig_for("gpupack-extender")),
            "--host", "127.0.0.1", "--port", str(cluster.extender_port), *cluster.extender_tls_flags(),
            "--lease-namespace", GPUPACK_NAMESPACE, "--lease-duration", "3",
        )  # fmt: skip
        ext_ops = f"http://127.0.0.1:{cluster.extender_ops_port}"
        _start(cluster, "deploy-extender", argv, f"{ext_ops}/readyz", timeout=90)
        hook = f"127.0.0.1:{cluster.webhook_port}"
        argv = (
            *py, "webhook", "serve",
            "--cert", str(cluster.webhook_cert_file), "--key", str(cluster.webhook_key_file),
            "--host", "127.0.0.1", "--port", str(cluster.webhook_port),
        )  # fmt: skip
        _start(cluster, "deploy-webhook", argv, f"https://{hook}/healthz", ca_file=str(cluster.ca_file))
        template = yaml.safe_load((REPO / "deploy/webhook/mutatingwebhookconfiguration.yaml").read_text())
        mwc = webhook_configuration(template, cluster.ca_bundle, url=f"https://{hook}/mutate")
        mwc["metadata"]["name"] = mwc_name
        admission.create_mutating_webhook_configuration(mwc)
        probe = share_pod("probe", {"gpu-fraction": "0.5"})
        wait_for(
            lambda: (
                (core.create_namespaced_pod(namespace, probe, dry_run="All").metadata.labels or {}).get(
                    "gpupack.io/managed"
                )
                == "true"
            ),
            30,
            "webhook mutating pods",
        )
        prom_cfg = tmp_path / "prometheus.yml"
        agents = {n: f"127.0.0.1:{p}" for n, p in agent_ports.items()}
        cfg = prometheus_config(f"127.0.0.1:{cluster.extender_ops_port}", hook, agents, str(cluster.ca_file))
        prom_cfg.write_text(yaml.safe_dump(cfg))
        argv = (
            prometheus, f"--config.file={prom_cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        )  # fmt: skip
        _start(cluster, "deploy-prometheus", argv, f"http://127.0.0.1:{prom_port}/-/ready")

        # a GPU quota on the namespace (the quota panels), computed before any pod it counts is created
        quota_key = "requests.gpupack.io/quota-gpu-milli"
        core.create_namespaced_resource_quota(
            namespace, {"metadata": {"name": "gpu"}, "spec": {"hard": {quota_key: "8000"}}}
        )
        wait_for(
            lambda: quota_key in (core.read_namespaced_resource_quota("gpu", namespace).status.hard or {}),
            60,
            "quota status computed",
        )
        # the workload: fractions and memory that fit, one asking for a model nobody has, one invalid
        fits = {
            "quarter-a": {"gpu-fraction": "0.25"},
            "quarter-b": {"gpu-fraction": "0.25"},
            "half": {"gpu-fraction": "0.5"},
            "mem-8g": {"gpu-memory": "8Gi"},
            "two-gpus": {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"},
        }
        for name, ann in fits.items():
            core.create_namespaced_pod(namespace, share_pod(name, ann))
        core.create_namespaced_pod(
            namespace, share_pod("no-model", {"gpu-fraction": "0.5", "gpupack.io/gpu-model": "H100"})
        )
        with pytest.raises(ApiException) as denied:
            core.create_namespaced_pod(namespace, share_pod("bad", {"gpu-fraction": "1.5"}))
        assert denied.value.status in (400, 403, 422)

        def bound() -> list[Any]:
            pods = [core.read_namespaced_pod(n, namespace) for n in fits]
            return pods if all(p.spec.node_name for p in pods) else []

        pods = wait_for(bound, 60, "the fitting pods bound")
        # their processes appear on the simulated GPUs they were given (the agent re-reads the file)
        per_node: dict[str, dict[int, list[dict[str, Any]]]] = {n: {} for n in nodes}
        pid = 4000
        for p in pods:
            ann = p.metadata.annotations
            for idx in ann["gpupack.io/gpu-indexes"].split(","):
                pid += 1
                per_node[p.spec.node_name].setdefault(int(idx), []).append(
                    {"pid": pid, "used_mib": 1024, "pod_uid": p.metadata.uid, "container": "main"}
                )
        for node in nodes:
            sim_file(tmp_path / f"{node}.yaml", gpus, per_node[node])

        base = f"http://127.0.0.1:{prom_port}"
        wait_for(
            lambda: len(prom_query(base, "up == 1")) == 2 + len(nodes),
            30,
            "every target scraped",
        )
        empty: list[str] = []

        def all_have_data() -> bool:
            empty.clear()
            empty.extend(
                f"{title}: {expr}" for title, expr in dashboard_queries() if not prom_query(base, expr)
            )
            return not empty

        try:
            wait_for(all_have_data, 90, "every dashboard query to return data")
        except Exception:
            pytest.fail("dashboard queries without data:\n" + "\n".join(empty), pytrace=False)
    finally:
        try:
            admission.delete_mutating_webhook_configuration(mwc_name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        for name in reversed(OBSERVE_PROCS):
            if any(p.name == name for p in cluster.processes):
                cluster.stop_process(name)
        OBSERVE_PROCS.clear()


def _start(
    cluster: Cluster,
    name: str,
    argv: tuple[str, ...],
    url: str,
    *,
    ca_file: str | None = None,
    timeout: float = 60,
) -> None:
    OBSERVE_PROCS.append(name)
    cluster.start_process(
        ComponentSpec(name, argv, health=HealthCheck(url, ca_file=ca_file), ready_timeout_s=timeout)
    )
