"""The harness is real: kube-scheduler, apiserver validation, RBAC, TLS to a webhook, daemonized `dev up`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity

from app.core import names
from tests.devcluster import Cluster, ComponentSpec, HealthCheck, wait_for
from tests.devcluster.processes import group_members, pid_alive

REPO = Path(__file__).resolve().parents[2]
POOL = "gpupack.test/pool"  # nodes of one test carry pool=<namespace>; its pods select them

# Minimal stand-ins for the extender and the webhook: just enough wire format to prove the scheduler and the
# apiserver really call a process started with cluster.start_process on the ports/certs the harness hands out.
STUB = r"""
import base64, http.server, json, os, ssl, sys, urllib.request
mode, port = sys.argv[1], int(sys.argv[2])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
    urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=os.environ.get("CA"))))

def extender(verb, args):
    if verb == "filter":
        nodes = sorted(args["NodeNames"])
        return {"NodeNames": nodes[-1:], "FailedNodes": {n: "stub keeps the last node" for n in nodes[:-1]},
                "FailedAndUnresolvableNodes": {}, "Error": ""}
    if verb == "prioritize":
        return [{"Host": n, "Score": 0} for n in args["NodeNames"]]
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": args["PodName"]},
               "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]}}
    url = f"{os.environ['API']}/api/v1/namespaces/{args['PodNamespace']}/pods/{args['PodName']}/binding"
    req = urllib.request.Request(url, data=json.dumps(binding).encode(), method="POST",
        headers={"Authorization": "Bearer " + os.environ["TOKEN"], "Content-Type": "application/json"})
    opener.open(req).read()
    return {"Error": ""}

def webhook(verb, review):
    patch = [{"op": "add", "path": "/metadata/labels/stub-mutated", "value": "yes"}]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch",
                         "patch": base64.b64encode(json.dumps(patch).encode()).decode()}}

class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.reply({"ok": True})
    def do_POST(self):
        args = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        verb = self.path.rstrip("/").rsplit("/", 1)[-1]
        print("call", verb, flush=True)
        self.reply((extender if mode == "extender" else webhook)(verb, args))

server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
if "CERT" in os.environ:  # both: kube-scheduler calls extenders over HTTPS too
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.environ["CERT"], os.environ["KEY"])
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""


def _pod(name: str, namespace: str, resources: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": resources}], **spec},
    }


def _wait_running(core: Any, name: str, namespace: str, timeout: float = 30) -> Any:
    def running() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase == "Running" else None

    return wait_for(running, timeout, f"pod {namespace}/{name} Running")


def _api_error(call: Callable[[], object]) -> tuple[int, str]:
    with pytest.raises(ApiException) as info:
        call()
    return info.value.status, json.loads(info.value.body)["message"]


def test_gpu_nodes_are_ready_and_advertise_gpupack_resources(core: Any, gpu_nodes: Any) -> None:
    (name,) = gpu_nodes(1, gpus_per_node=4, model="V100M32")
    node = core.read_node(name)
    assert node.metadata.labels[names.NODE_LABEL_GPU_MODEL] == "V100M32"
    assert node.metadata.labels[names.NODE_LABEL_GPU_MEMORY_MAX_MIB] == "32510"
    assert node.metadata.labels[names.NODE_LABEL_ENABLED] == "true"
    for field in (node.status.capacity, node.status.allocatable):
        assert parse_quantity(field[names.RESOURCE_GPU_MILLI]) == 4000
        assert parse_quantity(field[names.RESOURCE_GPU_MEMORY_MIB]) == 4 * 32510
    assert not node.spec.taints  # nothing would lift a not-ready taint: no kube-controller-manager runs
    assert node.status.node_info.kubelet_version == "kwok"


def test_plain_pod_is_scheduled_by_kube_scheduler_and_runs(core: Any, namespace: str, gpu_nodes: Any) -> None:
    nodes = gpu_nodes(2, gpus_per_node=1, model="T4", labels={POOL: namespace})
    core.create_namespaced_pod(
        namespace, _pod("cpu", namespace, {"requests": {"cpu": "100m"}}, nodeSelector={POOL: namespace})
    )
    pod = _wait_running(core, "cpu", namespace)
    assert pod.spec.node_name in nodes
    assert pod.status.pod_ip and pod.status.pod_ip.startswith("10.244.")  # kwok's pod CIDR
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=cpu").items
    scheduled = [e for e in events if e.reason == "Scheduled"]
    assert scheduled and scheduled[0].reporting_component == "default-scheduler"
    assert f"Successfully assigned {namespace}/cpu to {pod.spec.node_name}" == scheduled[0].message


def test_gpu_pod_goes_through_the_configured_extender(
    cluster: Cluster, core: Any, namespace: str, gpu_nodes: Any, tmp_path: Path
) -> None:
    nodes = gpu_nodes(3, gpus_per_node=2, model="T4", labels={POOL: namespace})
    stub = tmp_path / "stub.py"
    stub.write_text(STUB)
    cluster.start_process(
        ComponentSpec(
            "stub-extender",
            (sys.executable, str(stub), "extender", str(cluster.extender_port)),
            health=HealthCheck(f"{cluster.extender_url}/healthz", ca_file=str(cluster.ca_file)),
            env={
                "API": cluster.api_url,
                "TOKEN": cluster.token("admin"),
                "CA": str(cluster.ca_file),
                # the extender's serving pair; the stub asks for no client certificate
                "CERT": str(cluster.extender_tls[0]),
                "KEY": str(cluster.extender_tls[1]),
            },
        )
    )
    try:
        gpu = {names.RESOURCE_GPU_MILLI: "500"}
        core.create_namespaced_pod(
            namespace,
            _pod("gpu", namespace, {"requests": gpu, "limits": gpu}, nodeSelector={POOL: namespace}),
        )
        pod = _wait_running(core, "gpu", namespace)
        assert pod.spec.node_name == sorted(nodes)[-1]  # the stub's choice, not the scheduler's
        calls = Path(cluster.log_path("stub-extender")).read_text()
        assert "call filter" in calls and "call bind" in calls
    finally:
        cluster.stop_process("stub-extender")


def test_apiserver_calls_a_webhook_over_tls_with_the_harness_cert(
    cluster: Cluster, kube: Any, core: Any, namespace: str, tmp_path: Path
) -> None:
    stub = tmp_path / "stub.py"
    stub.write_text(STUB)
    port = cluster.webhook_port
    cluster.start_process(
        ComponentSpec(
            "stub-webhook",
            (sys.executable, str(stub), "webhook", str(port)),
            health=HealthCheck(f"https://127.0.0.1:{port}/healthz", ca_file=str(cluster.ca_file)),
            env={"CERT": str(cluster.webhook_cert_file), "KEY": str(cluster.webhook_key_file)},
        )
    )
    admission = client.AdmissionregistrationV1Api(kube)
    config_name = f"stub-{namespace}"
    admission.create_mutating_webhook_configuration(
        {
            "metadata": {"name": config_name},
            "webhooks": [
                {
                    "name": "stub.harness.gpupack.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",  # a TLS problem must fail the create, not be ignored
                    "timeoutSeconds": 5,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/mutate",
                        "caBundle": cluster.ca_bundle,
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                        }
                    ],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                }
            ],
        }
    )
    try:
        body = _pod("hooked", namespace, {})

        def mutated() -> bool:  # the configuration reaches the apiserver's admission chain asynchronously
            pod = core.create_namespaced_pod(namespace, body, dry_run="All")
            return (pod.metadata.labels or {}).get("stub-mutated") == "yes"

        wait_for(mutated, 30, "webhook mutation visible on a dry-run create")
        assert "call mutate" in Path(cluster.log_path("stub-webhook")).read_text()
    finally:
        admission.delete_mutating_webhook_configuration(config_name)
        cluster.stop_process("stub-webhook")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            _pod("Bad_Name", "{ns}", {}),
            'Pod "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": '
            "a lowercase RFC 1123 subdomain",
            id="bad-name",
        ),
        pytest.param(
            _pod(
                "unequal",
                "{ns}",
                {"requests": {names.RESOURCE_GPU_MILLI: "500"}, "limits": {names.RESOURCE_GPU_MILLI: "250"}},
            ),
            'Pod "unequal" is invalid: spec.containers[0].resources.requests: Invalid value: "500": '
            "must be equal to gpupack.io/gpu-milli limit of 250",
            id="extended-resource-request-not-limit",
        ),
    ],
)
def test_invalid_objects_are_refused_by_the_apiserver(
    core: Any, namespace: str, body: dict[str, Any], message: str
) -> None:
    body = {**body, "metadata": {**body["metadata"], "namespace": namespace}}
    status, got = _api_error(lambda: core.create_namespaced_pod(namespace, body))
    assert status == 422
    assert got.startswith(message)


def test_rbac_is_enforced_per_identity(cluster: Cluster, core: Any, namespace: str) -> None:
    def as_(identity: str) -> Any:
        return client.CoreV1Api(cluster.api_client(identity))

    agent_user = "system:serviceaccount:gpupack-system:gpupack-agent"
    status, message = _api_error(lambda: as_("gpupack-agent").delete_namespace(namespace))
    assert status == 403
    assert message == (
        f'namespaces "{namespace}" is forbidden: User "{agent_user}" cannot delete resource "namespaces" '
        f'in API group "" in the namespace "{namespace}"'
    )
    assert core.read_namespace(namespace).status.phase == "Active"
    # The scheduler gets exactly what bootstrap RBAC grants system:kube-scheduler: nodes yes, secrets no.
    assert isinstance(as_("scheduler").list_node().items, list)
    status, message = _api_error(lambda: as_("scheduler").list_namespaced_secret(namespace))
    assert (status, message.split(": ")[1]) == (
        403,
        'User "system:kube-scheduler" cannot list resource "secrets" in API group "" in the namespace "'
        + namespace
        + '"',
    )


def test_unknown_token_is_unauthorized(cluster: Cluster) -> None:
    cfg = client.Configuration()
    cfg.host = cluster.api_url
    cfg.ssl_ca_cert = str(cluster.ca_file)
    cfg.api_key = {"authorization": "Bearer not-a-token"}
    with client.ApiClient(cfg) as api:
        status, message = _api_error(lambda: client.CoreV1Api(api).list_namespace())
    assert (status, message) == (401, "Unauthorized")


def test_dev_up_is_idempotent_daemonized_and_down_leaves_no_process(
    cluster: Cluster, tmp_path: Path, run_devcluster: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    env = {**os.environ, "GPUPACK_K8S_BIN": str(cluster.bin_dir)}
    d = tmp_path / "dev"
    state = d / "state.json"
    # --no-components: the control plane alone (gpupack's own processes: tests/integration/test_dev_e2e.py).
    up = run_devcluster(
        "up", "--dir", str(d), "--nodes", "2", "--gpus-per-node", "2", "--gpu-model", "T4",
        "--no-components", env=env, timeout=240,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        assert f"kubectl --kubeconfig {d}/kubeconfig get nodes" in up.stdout
        procs = json.loads(state.read_text())["processes"]
        assert [p["name"] for p in procs] == [
            "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
        ]  # fmt: skip
        # `up` has exited; its processes live on, each leading its own session (not tied to our terminal).
        for p in procs:
            assert pid_alive(p["pid"], p["ticks"]), p["name"]
            assert os.getsid(p["pid"]) == p["pid"]
        with config.new_client_from_config(config_file=str(d / "kubeconfig")) as api:
            nodes = client.CoreV1Api(api).list_node().items
        assert sorted(n.metadata.name for n in nodes) == ["gpu-node-0", "gpu-node-1"]
        assert {parse_quantity(n.status.allocatable[names.RESOURCE_GPU_MILLI]) for n in nodes} == {2000}

        again = run_devcluster("up", "--dir", str(d), env=env, timeout=240)
        assert again.returncode == 0, again.stderr
        assert again.stdout.startswith(f"dev cluster already running in {d}")
        assert json.loads(state.read_text())["processes"] == procs  # same pids: nothing restarted

        status = run_devcluster("status", "--dir", str(d), env=env, timeout=240)
        assert status.returncode == 0, status.stdout
        assert status.stdout.count("healthy") == 5  # one line per process
    finally:
        down = run_devcluster("down", "--dir", str(d), env=env, timeout=120)
    assert down.returncode == 0, down.stderr
    for p in procs:
        assert not pid_alive(p["pid"], p["ticks"]), p["name"]
        assert group_members(p["pid"]) == [], p["name"]
    assert not state.exists()
    assert run_devcluster("status", "--dir", str(d), env=env, timeout=240).returncode == 1
