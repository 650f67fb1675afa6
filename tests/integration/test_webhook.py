"""The webhook as a real HTTPS process, called by a real kube-apiserver via deploy/webhook's configuration."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity
from prometheus_client.parser import text_string_to_metric_families

from app.core import names
from tests.devcluster import Cluster, ComponentSpec, HealthCheck, wait_for
from tests.devcluster.admission import webhook_configuration
from tests.devcluster.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "deploy" / "webhook" / "mutatingwebhookconfiguration.yaml"
PROCESS = "gpupack-webhook"
HOOK = "pods.webhook.gpupack.io"


def serve_argv(cert: Path, key: Path, port: int, *extra: str) -> tuple[str, ...]:
    return (
        sys.executable, "-m", "app.cli", "webhook", "serve",
        "--cert", str(cert), "--key", str(key), "--host", "127.0.0.1", "--port", str(port), *extra,
    )  # fmt: skip


def get(url: str, ca_file: Path) -> str:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),  # never proxy loopback
        urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(ca_file))),
    )
    with opener.open(url, timeout=5) as resp:
        text: str = resp.read().decode()
        return text


class Webhook:
    """Our running webhook: where it listens and what its /metrics say."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.url = f"https://127.0.0.1:{cluster.webhook_port}"

    def reviews(self) -> dict[str, float]:
        text = get(f"{self.url}/metrics", self.cluster.ca_file)
        for family in text_string_to_metric_families(text):
            if family.name == "gpupack_webhook_reviews":
                return {s.labels["outcome"]: s.value for s in family.samples if s.name.endswith("_total")}
        raise AssertionError("gpupack_webhook_reviews_total missing from /metrics")


def pod(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if annotations is not None:
        meta["annotations"] = annotations
    spec.setdefault("containers", [{"name": "main", "image": "cuda"}])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@pytest.fixture(scope="module")
def webhook(cluster: Cluster, kube: Any, core: Any) -> Iterator[Webhook]:
    port = cluster.webhook_port
    cluster.start_process(
        ComponentSpec(
            PROCESS,
            # Two worker processes (webhook.workers=2): every apiserver-driven case also holds with several.
            serve_argv(cluster.webhook_cert_file, cluster.webhook_key_file, port, "--workers", "2"),
            health=HealthCheck(f"https://127.0.0.1:{port}/readyz", ca_file=str(cluster.ca_file)),
            ready_timeout_s=60,
        )
    )
    admission = client.AdmissionregistrationV1Api(kube)
    body = webhook_configuration(
        yaml.safe_load(TEMPLATE.read_text()), cluster.ca_bundle, f"https://127.0.0.1:{port}/mutate"
    )
    admission.create_mutating_webhook_configuration(body)
    # One probe namespace per use of this fixture (test_quota imports it too); deleted at the end.
    probe_ns = f"webhook-probe-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": probe_ns}})
    try:

        def in_effect() -> bool:  # the configuration reaches the admission chain asynchronously
            created = core.create_namespaced_pod(
                probe_ns, pod("probe", {names.GPU_FRACTION: "0.5"}), dry_run="All"
            )
            return (created.metadata.labels or {}).get(names.LABEL_MANAGED) == "true"

        wait_for(in_effect, 60, "gpupack webhook mutating a dry-run pod create")
        yield Webhook(cluster)
    finally:
        admission.delete_mutating_webhook_configuration(body["metadata"]["name"])
        core.delete_namespace(probe_ns)
        cluster.stop_process(PROCESS)


def test_created_pod_comes_back_mutated(webhook: Webhook, core: Any, namespace: str) -> None:
    annotations = {
        names.GPU_FRACTION: "0.5",
        names.GPU_FRACTION_NUM_DEVICES: "2",
        names.GPU_FRACTION_CONTAINER_NAME: "trainer",
        names.GPU_MODEL: "A100-40GB|A100-80GB",
    }
    user_term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    body = pod(
        "frac",
        annotations,
        containers=[
            {"name": "proxy", "image": "envoy"},
            {"name": "trainer", "image": "cuda", "env": [{"name": "LR", "value": "0.1"}]},
        ],
        initContainers=[{"name": "fetch", "image": "busybox"}],
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [user_term]}
            }
        },
    )
    core.create_namespaced_pod(namespace, body)
    got = core.read_namespaced_pod("frac", namespace)

    assert got.metadata.labels == {names.LABEL_MANAGED: "true"}
    proxy, trainer = got.spec.containers
    fetch = got.spec.init_containers[0]
    for other in (proxy, fetch):
        assert [(e.name, e.value) for e in other.env] == [("NVIDIA_VISIBLE_DEVICES", "void")]
    env = {e.name: e for e in trainer.env}
    assert env["LR"].value == "0.1"
    refs = {n: e.value_from.field_ref.field_path for n, e in env.items() if e.value_from}
    assert refs == {
        "NVIDIA_VISIBLE_DEVICES": f"metadata.annotations['{names.ALLOC_GPU_UUIDS}']",
        "CUDA_VISIBLE_DEVICES": f"metadata.annotations['{names.ALLOC_GPU_UUIDS}']",
        "GPUPACK_MEMORY_LIMIT_MIB": f"metadata.annotations['{names.ALLOC_MEMORY_LIMIT_MIB}']",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": f"metadata.annotations['{names.ALLOC_THREAD_PERCENTAGE}']",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"metadata.annotations['{names.ALLOC_MPS_MEMORY_LIMIT}']",
    }
    assert env["CUDA_MPS_PIPE_DIRECTORY"].value == names.MPS_PIPE_DIRECTORY
    for part in (trainer.resources.requests, trainer.resources.limits):
        assert parse_quantity(part[names.RESOURCE_GPU_MILLI]) == 1000  # 0.5 x 2 devices (stored as "1k")
    assert proxy.resources.limits is None
    assert [m.mount_path for m in trainer.volume_mounts if m.name == "gpupack-mps-pipe"] == [
        names.MPS_PIPE_DIRECTORY
    ]
    [volume] = [v for v in got.spec.volumes if v.name == "gpupack-mps-pipe"]
    assert volume.host_path.path == names.MPS_PIPE_DIRECTORY
    required = got.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    terms = required.node_selector_terms
    assert len(terms) == 1
    assert [(e.key, e.operator, e.values) for e in terms[0].match_expressions] == [
        ("zone", "In", ["a"]),  # the user's term is kept, ours are ANDed into it
        (names.NODE_LABEL_ENABLED, "In", ["true"]),
        (names.NODE_LABEL_GPU_MODEL, "In", ["A100-40GB", "A100-80GB"]),
    ]
    assert got.spec.scheduler_name == "default-scheduler"


def test_memory_request_gets_memory_resource_and_gt(webhook: Webhook, core: Any, namespace: str) -> None:
    created = core.create_namespaced_pod(namespace, pod("mem", {names.GPU_MEMORY: "8Gi"}), dry_run="All")
    main = created.spec.containers[0]
    assert parse_quantity(main.resources.limits[names.RESOURCE_GPU_MEMORY_MIB]) == 8192
    assert parse_quantity(main.resources.requests[names.RESOURCE_GPU_MEMORY_MIB]) == 8192
    terms = created.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    exprs = [(e.key, e.operator, e.values) for e in terms.node_selector_terms[0].match_expressions]
    assert (names.NODE_LABEL_GPU_MEMORY_MAX_MIB, "Gt", ["8191"]) in exprs


def test_mig_profile_pod_is_sent_and_gets_the_mig_uuid_env_without_mps(
    webhook: Webhook, core: Any, namespace: str
) -> None:
    """The webhook's matchConditions send a pod with only gpupack.io/mig-profile; it gets no MPS env."""
    created = core.create_namespaced_pod(namespace, pod("mig", {names.MIG_PROFILE: "1g.10gb"}), dry_run="All")
    main = created.spec.containers[0]
    assert created.metadata.labels == {names.LABEL_MANAGED: "true"}
    assert parse_quantity(main.resources.limits[names.RESOURCE_GPU_MEMORY_MIB]) == 9728
    env = {e.name: e for e in main.env}
    assert sorted(env) == ["CUDA_VISIBLE_DEVICES", "GPUPACK_MEMORY_LIMIT_MIB", "NVIDIA_VISIBLE_DEVICES"]
    ref = env["CUDA_VISIBLE_DEVICES"].value_from.field_ref.field_path
    assert ref == f"metadata.annotations['{names.ALLOC_GPU_UUIDS}']"


def test_burstable_and_kai_nvfractions_pods_are_sent_and_charged_their_request(
    webhook: Webhook, core: Any, namespace: str
) -> None:
    """gpupack.io/gpu-memory-limit and KAI's per-container names reach the webhook (matchConditions); the
    pod is placed and charged by its request, and its GPU container is told where its hard limit is."""
    burst = {names.GPU_MEMORY: "4Gi", names.GPU_MEMORY_LIMIT: "8Gi"}
    kai = {  # KAI's NvFractions request-and-limit example, on a second container
        "nvidia.com/container.gpu-workload.gpu-memory.request": "4096Mi",
        "nvidia.com/container.gpu-workload.gpu-memory.limit": "8192Mi",
        "kai.scheduler/gpu-compute-sharing-mode": "time-slicing",
    }
    two = [{"name": "proxy", "image": "envoy"}, {"name": "gpu-workload", "image": "cuda"}]
    for name, ask, containers in (("burst", burst, None), ("kai", kai, two)):
        spec = {"containers": containers} if containers else {}
        created = core.create_namespaced_pod(namespace, pod(name, ask, **spec), dry_run="All")
        assert created.metadata.labels == {names.LABEL_MANAGED: "true"}, name
        gpu = created.spec.containers[-1]
        for part in (gpu.resources.requests, gpu.resources.limits):
            assert parse_quantity(part[names.RESOURCE_GPU_MEMORY_MIB]) == 4096, name
            assert parse_quantity(part[names.RESOURCE_QUOTA_GPU_MEMORY_MIB]) == 4096, name
        ref = {e.name: e.value_from.field_ref.field_path for e in gpu.env if e.value_from}
        assert (
            ref[names.ENV_MEMORY_HARD_LIMIT_MIB]
            == f"metadata.annotations['{names.ALLOC_MEMORY_HARD_LIMIT_MIB}']"
        )
        assert ref[names.ENV_MPS_MEMORY_LIMIT] == f"metadata.annotations['{names.ALLOC_MPS_MEMORY_LIMIT}']"
    assert [e.value for e in created.spec.containers[0].env] == [names.NO_GPU]  # the KAI pod's proxy


@pytest.mark.parametrize(
    ("annotations", "resources", "message"),
    [
        pytest.param(
            {names.GPU_FRACTION: "1.5"},
            None,
            "gpu-fraction='1.5': must be a decimal in (0, 1] with at most 2 decimals",
            id="fraction-above-one",
        ),
        pytest.param(
            {names.GPU_FRACTION: "NaN"},
            None,
            "gpu-fraction='NaN': must be a decimal in (0, 1] with at most 2 decimals",
            id="fraction-nan",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.GPU_MEMORY: "4Gi"},
            None,
            "gpu-memory='4Gi': must not be set together with gpu-fraction; use one",
            id="both",
        ),
        pytest.param(
            {names.GPU_MEMORY: "4Gi"},
            {"limits": {"nvidia.com/gpu": "1"}},
            "gpu-memory='4Gi': must not be combined with nvidia.com/gpu (requested by container 'main')",
            id="with-nvidia-gpu",
        ),
        pytest.param(
            {names.GPU_MEMORY: "1Ti"},
            None,
            "gpu-memory='1Ti': is 1048576 MiB, more than any GPU gpupack knows (A100-80GB has 81920 MiB)",
            id="memory-too-big",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_NUM_DEVICES: "0", names.ISOLATION: "full"},
            None,
            "gpu-fraction-num-devices='0': must be an integer from 1 to 16; "
            "gpupack.io/isolation='full': must be one of 'mps', 'none', 'mig'",
            id="two-errors",
        ),
        pytest.param(
            {names.GPU_MEMORY: "8Gi", names.GPU_MEMORY_LIMIT: "4Gi"},
            None,
            "gpupack.io/gpu-memory-limit='4Gi': is 4096 MiB, less than gpu-memory (8192 MiB): the limit must "
            "be at least the request",
            id="limit-below-request",
        ),
        pytest.param(
            {names.GPU_MEMORY_LIMIT: "8Gi"},
            None,
            "gpu-fraction='': one of gpu-fraction or gpu-memory is required",
            id="limit-without-request",
        ),
        pytest.param(
            {"nvidia.com/container.trainer.gpu-memory.limit": "8Gi"},
            None,
            "nvidia.com/container.trainer.gpu-memory.limit='8Gi': names container 'trainer', which the pod "
            "does not have ('main')",
            id="kai-names-no-such-container",
        ),
        pytest.param(
            {names.MIG_PROFILE: "1g.9gb"},
            None,
            "gpupack.io/mig-profile='1g.9gb': must be a MIG profile gpupack knows (1g.5gb, 1g.10gb",
            id="unknown-mig-profile",
        ),
    ],
)
def test_invalid_annotations_are_refused_by_the_apiserver(
    webhook: Webhook,
    core: Any,
    namespace: str,
    *,
    annotations: dict[str, str],
    resources: dict[str, Any] | None,
    message: str,
) -> None:
    container: dict[str, Any] = {"name": "main", "image": "cuda"}
    if resources:
        container["resources"] = resources
    before = webhook.reviews()["denied"]
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(namespace, pod("bad", annotations, containers=[container]))
    assert err.value.status == 422
    assert f'admission webhook \\"{HOOK}\\" denied the request: {message}' in err.value.body
    assert webhook.reviews()["denied"] == before + 1


def test_pods_without_gpu_like_keys_are_never_sent(webhook: Webhook, core: Any, namespace: str) -> None:
    before = webhook.reviews()
    core.create_namespaced_pod(namespace, pod("plain"))
    core.create_namespaced_pod(namespace, pod("others", {"team": "a", "app.kubernetes.io/name": "web"}))
    # Excluded namespace: even a GPU pod there is not sent (dry run: nothing to clean up).
    system = core.create_namespaced_pod("kube-system", pod("sys", {names.GPU_FRACTION: "0.5"}), dry_run="All")
    assert not (system.metadata.labels or {}).get(names.LABEL_MANAGED)
    for name in ("plain", "others"):
        assert not (core.read_namespaced_pod(name, namespace).metadata.labels or {}).get(names.LABEL_MANAGED)
    assert webhook.reviews() == before


def _with(resources: dict[str, Any], init: bool = False) -> dict[str, Any]:
    gpu = {"name": "warm" if init else "main", "image": "cuda", "resources": resources}
    if init:
        return {"containers": [{"name": "main", "image": "cuda"}], "initContainers": [gpu]}
    return {"containers": [gpu]}


MILLI = {names.RESOURCE_GPU_MILLI: "600"}


@pytest.mark.parametrize(
    ("spec", "resource", "where"),
    [
        pytest.param(
            _with({"requests": MILLI, "limits": MILLI}),
            names.RESOURCE_GPU_MILLI,
            "container 'main'",
            id="requests-and-limits",
        ),
        pytest.param(
            _with({"limits": {names.RESOURCE_GPU_MEMORY_MIB: "4096"}}),
            names.RESOURCE_GPU_MEMORY_MIB,
            "container 'main'",
            id="limits-only",
        ),
        pytest.param(
            _with({"limits": MILLI}, init=True), names.RESOURCE_GPU_MILLI, "init container 'warm'", id="init"
        ),
    ],
)
def test_our_resources_without_annotations_are_refused_by_the_apiserver(
    webhook: Webhook, core: Any, namespace: str, *, spec: dict[str, Any], resource: str, where: str
) -> None:
    """matchConditions send such pods to the webhook, which refuses them naming the resource and the fix."""
    before = webhook.reviews()["denied"]
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(namespace, pod("direct", {"team": "a"}, **spec))
    assert err.value.status == 422
    body = err.value.body
    assert f'admission webhook \\"{HOOK}\\" denied the request: {resource}=' in body
    assert f"requested by {where} without a GPU-share annotation" in body
    assert f"annotate the pod with {names.GPU_FRACTION}" in body
    assert webhook.reviews()["denied"] == before + 1
    assert core.list_namespaced_pod(namespace).items == []


def test_serving_cert_rotation_without_restart(cluster: Cluster, tmp_path: Path) -> None:
    """`gpupack certs` over the live files: new connections get the new cert, the process keeps running."""
    gpupack = (sys.executable, "-m", "app.cli")
    subprocess.run(
        [*gpupack, "certs", "--out", str(tmp_path), "--ip", "127.0.0.1"], check=True, capture_output=True
    )
    port = free_ports(1)[0]
    name = "webhook-rotation"
    cluster.start_process(
        ComponentSpec(
            name,
            serve_argv(tmp_path / "tls.crt", tmp_path / "tls.key", port, "--cert-check-interval", "0.2"),
            health=HealthCheck(f"https://127.0.0.1:{port}/healthz", ca_file=str(tmp_path / "ca.crt")),
        )
    )
    try:

        def served_serial() -> int:
            get(f"https://127.0.0.1:{port}/healthz", tmp_path / "ca.crt")  # what is served verifies
            pem = ssl.get_server_certificate(("127.0.0.1", port), timeout=5)
            return x509.load_pem_x509_certificate(pem.encode()).serial_number

        first = served_serial()
        subprocess.run(
            [*gpupack, "certs", "--out", str(tmp_path), "--ip", "127.0.0.1"], check=True, capture_output=True
        )
        new = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes()).serial_number
        assert new != first
        wait_for(lambda: served_serial() == new, 15, "the rotated certificate served on a new connection")
        assert cluster.process(name).alive()
    finally:
        cluster.stop_process(name)


def dry_run_warnings(
    cluster: Cluster, namespace: str, body: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Create `body` with dryRun=All as kubectl does; the pod returned and the apiserver's Warning headers,
    as `kubectl create --dry-run=server` prints them ("Warning: <text>")."""
    url = f"{cluster.api_url}/api/v1/namespaces/{namespace}/pods?dryRun=All"
    data = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {cluster.token('admin')}", "Content-Type": "application/json"}
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(cluster.ca_file))),
    )
    with opener.open(urllib.request.Request(url, data=data, headers=headers), timeout=10) as resp:
        created: dict[str, Any] = json.loads(resp.read())
        # RFC 7234 warn-value as the apiserver writes it: 299 - "<text>" (our texts hold no '"' or '\').
        texts = [v.removeprefix('299 - "').removesuffix('"') for v in resp.headers.get_all("Warning") or []]
    return created, texts


@pytest.mark.parametrize("key", ["gpu_fraction", "GPU-Fraction", "gpu-fractions"])
def test_a_near_miss_key_reaches_the_webhook_and_is_warned_not_mutated(
    webhook: Webhook, cluster: Cluster, namespace: str, key: str
) -> None:
    """The matchConditions send pods with GPU-like keys; the user sees the key gpupack reads, the pod is
    admitted as written."""
    created, warnings = dry_run_warnings(cluster, namespace, pod("typo", {key: "0.5"}))
    assert not (created["metadata"].get("labels") or {})
    assert "env" not in created["spec"]["containers"][0]
    assert warnings == [
        f"annotation {key!r} is not read by gpupack; did you mean 'gpu-fraction'?",
        f"gpupack gives this pod no GPU share: none of its GPU annotations ({key!r}) asks for one; a share "
        "is asked with gpu-fraction, gpu-memory or gpupack.io/mig-profile",
    ]


def test_kai_limits_reach_the_webhook_and_a_limit_below_the_request_is_refused_by_name(
    webhook: Webhook, core: Any, cluster: Cluster, namespace: str
) -> None:
    created, warnings = dry_run_warnings(
        cluster, namespace, pod("kai-limit", {names.GPU_FRACTION: "0.5", names.KAI_FRACTION_LIMIT: "0.75"})
    )
    assert created["metadata"]["labels"] == {names.LABEL_MANAGED: "true"} and warnings == []
    env = {e["name"] for e in created["spec"]["containers"][0]["env"]}
    assert names.ENV_MEMORY_HARD_LIMIT_MIB in env
    with pytest.raises(ApiException) as refused:
        body = pod("kai-below", {names.GPU_MEMORY: "8Gi", names.KAI_GPU_MEMORY_LIMIT: "4Gi"})
        core.create_namespaced_pod(namespace, body, dry_run="All")
    assert refused.value.status == 422
    rule = "is 4096 MiB, less than gpu-memory (8192 MiB): the limit must be at least the request"
    assert f"gpu-memory.limit='4Gi': {rule}" in json.loads(refused.value.body)["message"]


def test_a_pod_whose_gpu_keys_ask_for_nothing_is_sent_skipped_and_told(
    webhook: Webhook, cluster: Cluster, namespace: str
) -> None:
    """gpu-fraction-num-devices alone, and a GPU-like key of another tool: no share, and the user hears so."""
    before = webhook.reviews()
    annotations = {names.GPU_FRACTION_NUM_DEVICES: "2", "nvidia.com/gpu.product": "A100"}
    created, warnings = dry_run_warnings(cluster, namespace, pod("count-only", annotations))
    assert not (created["metadata"].get("labels") or {})
    assert warnings == [
        "gpupack gives this pod no GPU share: none of its GPU annotations ('gpu-fraction-num-devices', "
        "'nvidia.com/gpu.product') asks for one; a share is asked with gpu-fraction, gpu-memory or "
        "gpupack.io/mig-profile"
    ]
    assert webhook.reviews()["skipped"] == before["skipped"] + 1
