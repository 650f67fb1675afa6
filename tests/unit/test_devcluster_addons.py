"""`make dev` addons, the parts that need no cluster: RBAC selection, webhook fill, sim files, argv."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.simgpu import simfile
from app import cli
from app.core import catalog, names, podview, request
from tests.devcluster import addons, admission, command, nodeside
from tests.devcluster.cluster import Cluster
from tests.devcluster.identities import IDENTITIES
from tests.devcluster.layout import Layout, Ports
from tests.devcluster.nodes import MigLayout, node_body
from tests.devcluster.processes import ManagedProcess

REPO = Path(__file__).resolve().parents[2]
SAMPLES = sorted((REPO / addons.SIM_SAMPLES_RELPATH).glob("*.yaml"))


def manifest_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / addons.MANIFEST_RELPATH).read_text()) if d]


# ---- admission policies from the rendered chart ----


def test_policies_come_from_the_chart_policies_before_bindings() -> None:
    objs = addons.policy_objects(manifest_docs())
    got = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert sorted(got) == [
        ("ValidatingAdmissionPolicy", "gpupack-agent-own-node"),
        ("ValidatingAdmissionPolicy", "gpupack-pod-allocation"),
        ("ValidatingAdmissionPolicy", "gpupack-quota-resources"),
        ("ValidatingAdmissionPolicyBinding", "gpupack-agent-own-node"),
        ("ValidatingAdmissionPolicyBinding", "gpupack-pod-allocation"),
        ("ValidatingAdmissionPolicyBinding", "gpupack-quota-resources"),
    ]
    kinds = [k for k, _ in got]
    assert kinds == sorted(kinds, key=lambda k: k.endswith("Binding"))
    assert addons.policy_objects(manifest_docs(), ("scheduler",)) == []


def test_scoped_binding_limits_a_copy_to_one_namespace_or_named_objects() -> None:
    binding = {
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "gpupack-pod-allocation", "labels": {"a": "b"}},
        "spec": {"policyName": "gpupack-pod-allocation", "validationActions": ["Deny"]},
    }
    original = copy.deepcopy(binding)
    ns = addons.scoped_binding(binding, namespace="t-1")
    assert binding == original
    assert ns["metadata"] == {"name": "gpupack-pod-allocation-t-1", "labels": {"a": "b"}}
    assert ns["spec"]["policyName"] == "gpupack-pod-allocation"
    assert ns["spec"]["matchResources"] == {
        "namespaceSelector": {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["t-1"]}]
        }
    }
    named = addons.scoped_binding(binding, object_names=["n1", "n2"])
    assert named["metadata"]["name"] == "gpupack-pod-allocation-n1-n2"
    (rule,) = named["spec"]["matchResources"]["resourceRules"]
    assert rule["resourceNames"] == ["n1", "n2"] and rule["resources"] == ["*/*"]
    with pytest.raises(ValueError, match="cluster-wide"):
        addons.scoped_binding(binding)


def test_agent_tokens_are_bound_to_a_pod_on_its_node() -> None:
    pod = addons.agent_anchor_pod("gpu-0")
    assert pod["metadata"]["namespace"] == "gpupack-system"
    assert pod["spec"]["nodeName"] == "gpu-0"
    assert pod["spec"]["serviceAccountName"] == "gpupack-agent"
    assert pod["spec"]["automountServiceAccountToken"] is False
    req = addons.bound_token_request(pod["metadata"]["name"], "uid-1", 3600)
    assert req["spec"] == {
        "expirationSeconds": 3600,
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "gpupack-agent-gpu-0", "uid": "uid-1"},
    }


def test_allocation_probe_pod_carries_an_allocation_annotation_only() -> None:
    pod = addons.allocation_probe_pod()
    assert set(pod["metadata"]["annotations"]) == {names.ALLOC_NODE}
    assert "labels" not in pod["metadata"]


# ---- RBAC from the rendered chart ----


def test_rbac_comes_from_the_chart_for_the_three_components_only() -> None:
    objs = addons.rbac_objects(manifest_docs())
    got = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert ("ClusterRole", "gpupack-extender") in got
    assert ("ClusterRole", "gpupack-agent") in got
    assert ("Role", "gpupack-extender-leader-election") in got
    assert all(o["metadata"]["labels"][addons.COMPONENT_LABEL] in addons.COMPONENTS for o in objs)
    assert not any("scheduler" in name for _, name in got)  # the dev scheduler has its own bootstrap RBAC
    kinds = [o["kind"] for o in objs]
    assert kinds.index("RoleBinding") > kinds.index("Role")
    assert max(i for i, k in enumerate(kinds) if "Binding" not in k) < min(
        i for i, k in enumerate(kinds) if "Binding" in k
    )


def test_every_binding_subject_is_a_dev_identity() -> None:
    """The chart binds ServiceAccounts; the dev tokens must authenticate as exactly those users."""
    users = {i.user for i in IDENTITIES}
    for obj in addons.rbac_objects(manifest_docs()):
        for subject in obj.get("subjects", []):
            assert subject["kind"] == "ServiceAccount"
            user = f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
            assert user in users, (obj["metadata"]["name"], user)


def test_rbac_selection_by_kind_and_component_label() -> None:
    def doc(kind: str, name: str, component: str | None) -> dict[str, Any]:
        labels = {addons.COMPONENT_LABEL: component} if component else {}
        return {"kind": kind, "metadata": {"name": name, "labels": labels}}

    docs = [
        doc("ClusterRoleBinding", "a-binding", "agent"),
        doc("ServiceAccount", "sa", "agent"),  # implied by the harness's static token
        doc("ClusterRole", "a-role", "agent"),
        doc("ClusterRole", "sched", "scheduler"),
        doc("ClusterRole", "unlabelled", None),
        None,  # an empty YAML document
        doc("Deployment", "d", "extender"),
    ]
    got = addons.rbac_objects(docs)
    assert [o["metadata"]["name"] for o in got] == ["a-role", "a-binding"]
    assert addons.rbac_objects(docs, components=("scheduler",))[0]["metadata"]["name"] == "sched"


# ---- webhook configuration ----


def test_webhook_configuration_points_at_the_url_with_the_ca() -> None:
    template = yaml.safe_load((REPO / addons.WEBHOOK_CONFIG_RELPATH).read_text())
    before = copy.deepcopy(template)
    got = admission.webhook_configuration(template, "Q0E=", "https://127.0.0.1:1234/mutate")
    assert template == before  # the template is not modified
    # Each entry keeps its own path (one per Pod Security level), on the url's host and port.
    urls = [hook["clientConfig"]["url"] for hook in got["webhooks"]]
    assert urls == [
        "https://127.0.0.1:1234/mutate",
        "https://127.0.0.1:1234/mutate/pod-security/baseline",
        "https://127.0.0.1:1234/mutate/pod-security/restricted",
    ]
    assert all(hook["clientConfig"]["caBundle"] == "Q0E=" for hook in got["webhooks"])
    assert all(set(hook["clientConfig"]) == {"url", "caBundle"} for hook in got["webhooks"])
    # Without a url the Service reference stays (the chart's in-cluster form); only the CA is filled.
    in_cluster = admission.webhook_configuration(template, "Q0E=")
    for hook, orig in zip(in_cluster["webhooks"], template["webhooks"], strict=True):
        assert hook["clientConfig"] == {**orig["clientConfig"], "caBundle": "Q0E="}


def test_probe_pod_is_one_the_webhook_is_sent() -> None:
    pod = addons.probe_pod()
    assert podview.ask_of(pod["metadata"]["annotations"]).wanted
    assert addons.PROBE_NAMESPACE not in ("kube-system", "gpupack-system")  # excluded by namespaceSelector


# ---- simulated GPU sets ----


def test_sim_document_has_count_idle_gpus_of_the_catalogue_name() -> None:
    doc = addons.sim_document("Tesla T4", 3)
    assert doc == {"gpus": [{"model": "T4"}] * 3}
    parsed = simfile.parse(doc, "generated", node="gpu-node-0")
    assert [(g.model, g.memory_mib, g.used_mib) for g in parsed.gpus] == [
        ("T4", catalog.lookup("T4").memory_mib, 0)
    ] * 3
    with pytest.raises(ValueError, match="count=0"):
        addons.sim_document("T4", 0)
    with pytest.raises(KeyError):
        addons.sim_document("H999", 1)


def test_one_generated_file_gives_each_node_its_own_uuids() -> None:
    doc = addons.sim_document("A100-40GB", 2)
    a = [g.uuid for g in simfile.parse(doc, "x", node="gpu-node-0").gpus]
    b = [g.uuid for g in simfile.parse(doc, "x", node="gpu-node-1").gpus]
    again = [g.uuid for g in simfile.parse(doc, "x", node="gpu-node-0").gpus]
    assert len(set(a + b)) == 4
    assert a == again  # stable across agent restarts


@pytest.mark.parametrize(
    ("doc", "model", "count", "idle"),
    [
        ({"gpus": [{"model": "T4"}, {"model": "Tesla T4"}]}, "T4", 2, True),
        ({"driver_version": "1", "gpus": [{"model": "T4", "base_used_mib": 0}]}, "T4", 1, True),
        ({"gpus": [{"model": "T4"}]}, "T4", 2, False),  # count
        ({"gpus": [{"model": "T4"}]}, "A100-40GB", 1, False),  # model
        ({"gpus": [{"model": "T4", "base_used_mib": 300}]}, "T4", 1, False),  # memory in use
        ({"gpus": [{"model": "T4", "processes": []}]}, "T4", 1, False),  # anything more than the shape
        ({"gpus": [{"model": "T4", "lost": True}]}, "T4", 1, False),
        ({"init_error": "NVML_ERROR_DRIVER_NOT_LOADED", "gpus": [{"model": "T4"}]}, "T4", 1, False),
        ({"gpus": [{"model": "nope"}]}, "T4", 1, False),
        ("gpus: []", "T4", 1, False),
        (None, "T4", 1, False),
    ],
)
def test_is_idle_set(doc: Any, model: str, count: int, idle: bool) -> None:
    assert addons.is_idle_set(doc, model, count) is idle


def test_a_matching_sample_is_used_as_is(tmp_path: Path) -> None:
    path = addons.sim_file_for("A100-40GB", 4, SAMPLES, tmp_path / "sim")
    assert path.name == "a100x4.yaml" and path.parent == REPO / addons.SIM_SAMPLES_RELPATH
    assert not (tmp_path / "sim").exists()


def test_samples_with_load_or_faults_are_not_used(tmp_path: Path) -> None:
    # t4x2.yaml is two T4 but runs processes: a fresh dev cluster must start with idle GPUs.
    assert any(p.name == "t4x2.yaml" for p in SAMPLES)
    path = addons.sim_file_for("T4", 2, SAMPLES, tmp_path / "sim")
    assert path == tmp_path / "sim" / "T4x2.yaml"
    parsed = simfile.load(path, node="gpu-node-0")
    assert [g.model for g in parsed.gpus] == ["T4", "T4"]
    assert all(g.used_mib == 0 and not g.processes for g in parsed.gpus)
    # Rewritten (not appended to) when generated again.
    assert addons.sim_file_for("Tesla T4", 2, SAMPLES, tmp_path / "sim").read_text() == path.read_text()


def test_node_shape_reads_model_label_and_milli_capacity() -> None:
    body = node_body("gpu-node-0", 8, "A100-40GB")
    assert addons.node_shape(body) == addons.NodeShape("A100-40GB", 8)
    body["status"]["capacity"][names.RESOURCE_GPU_MILLI] = "2k"  # as the apiserver returns 2000
    assert addons.node_shape(body) == addons.NodeShape("A100-40GB", 2)
    body["status"]["capacity"][names.RESOURCE_GPU_MILLI] = "1500"
    with pytest.raises(ValueError, match="not a whole number of GPUs"):
        addons.node_shape(body)
    plain = {"metadata": {"name": "cpu-only", "labels": {}}, "status": {"capacity": {"cpu": "4"}}}
    with pytest.raises(ValueError, match="not a gpupack dev node"):
        addons.node_shape(plain)


def test_a_mig_layout_goes_from_the_node_to_a_simulated_set_in_mig_mode(tmp_path: Path) -> None:
    layout = MigLayout(("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"), gpus=1)
    body = node_body("gpu-node-0", 2, "A100-80GB", mig=layout)
    shape = addons.node_shape(body)
    assert shape == addons.NodeShape("A100-80GB", 2, layout)
    path = addons.sim_file_for(shape.model, shape.gpus, SAMPLES, tmp_path / "sim", shape.mig)
    parsed = simfile.load(path, node="gpu-node-0")
    partitioned, whole = parsed.gpus
    assert partitioned.mig_enabled and not whole.mig_enabled and whole.mig_devices == ()
    assert [(m.profile, m.memory_mib) for m in partitioned.mig_devices] == [
        ("3g.40gb", 40192),
        ("2g.20gb", 19968),
        ("1g.10gb", 9728),
        ("1g.10gb", 9728),
    ]


@pytest.mark.parametrize(
    ("model", "profiles", "gpus", "rule"),
    [
        ("T4", ("1g.10gb",), 1, "model T4 has no MIG support"),
        ("A100-80GB", ("1g.5gb",), 1, "'1g.5gb' must be a MIG profile of A100-80GB (1g.10gb, 1g.20gb"),
        ("A100-80GB", ("4g.40gb", "4g.40gb"), 1, "must name 1 to 7 compute slices of MIG devices: names 8"),
        ("A100-80GB", ("1g.10gb",), 3, "MIG GPUs per node=3: must be from 1 to the GPUs per node (2)"),
    ],
)
def test_impossible_mig_layouts_are_refused_with_the_rule(
    model: str, profiles: tuple[str, ...], gpus: int, rule: str
) -> None:
    assert MigLayout(profiles, gpus).error(model, 2).startswith(rule)
    with pytest.raises(ValueError, match="mig="):
        addons.sim_document(model, 2, MigLayout(profiles, gpus))


# ---- command lines: every flag exists in the real CLI ----


def parse_cli(argv: tuple[str, ...]) -> Any:
    assert argv[1:3] == ("-m", "app.cli")
    return cli.build_parser().parse_args(list(argv[3:]))


def test_component_argv_parse_with_the_real_cli(tmp_path: Path) -> None:
    tls = (tmp_path / "e.crt", tmp_path / "e.key", tmp_path / "client-ca.crt")
    ext = parse_cli(addons.extender_spec(1111, 1112, tmp_path / "e.kubeconfig", tls).argv)
    assert (ext.command, ext.port, ext.ops_port, ext.host, ext.lease_namespace) == (
        "extender",
        1111,
        1112,
        "127.0.0.1",
        "gpupack-system",
    )
    assert ext.kubeconfig == str(tmp_path / "e.kubeconfig")
    assert (ext.tls_cert, ext.tls_key, ext.client_ca) == tuple(str(p) for p in tls)
    hook_spec = addons.webhook_spec(2222, tmp_path / "c", tmp_path / "k", tmp_path / "ca", tmp_path / "w")
    hook = parse_cli(hook_spec.argv)
    assert (
        hook.command,
        hook.port,
        hook.cert,
        hook.key,
        hook.read_gpunodes,
        hook.kubeconfig,
        hook.runtime_class,
    ) == (
        "webhook",
        2222,
        str(tmp_path / "c"),
        str(tmp_path / "k"),
        True,
        str(tmp_path / "w"),
        None,
    )
    spec = addons.webhook_spec(
        2222, tmp_path / "c", tmp_path / "k", tmp_path / "ca", tmp_path / "w", runtime_class="gpupack"
    )
    assert parse_cli(spec.argv).runtime_class == "gpupack"
    spec = addons.agent_spec(
        "gpu-node-1", sim=tmp_path / "s.yaml", port=3333, kubeconfig=tmp_path / "a", state_dir=tmp_path
    )
    agent = parse_cli(spec.argv)
    assert (agent.command, agent.node, agent.port, agent.sim) == (
        "agent",
        "gpu-node-1",
        3333,
        tmp_path / "s.yaml",
    )
    assert agent.mps is False and agent.heartbeat == 30.0
    assert spec.name == "gpupack-agent-gpu-node-1" and spec.env == {"NODE_NAME": "gpu-node-1"}
    assert spec.health is not None and spec.health.url == "http://127.0.0.1:3333/healthz"


def test_extender_is_ready_only_as_leader_with_synced_informers(tmp_path: Path) -> None:
    spec = addons.extender_spec(1111, 1112, tmp_path / "k", (tmp_path / "c", tmp_path / "k", tmp_path / "a"))
    # the plain ops port: the HTTPS port would need the scheduler's client certificate
    assert spec.health is not None and spec.health.url == "http://127.0.0.1:1112/readyz"


# ---- `dev up` flags and output ----


def test_no_components_flag() -> None:
    dev = command.parser()
    assert dev.parse_args(["up"]).components is True
    assert dev.parse_args(["up", "--no-components"]).components is False


def fake_cluster(tmp_path: Path, names_: list[str]) -> Cluster:
    procs = [ManagedProcess(n, 100 + i, 1, str(tmp_path / f"{n}.log"), ("x",)) for i, n in enumerate(names_)]
    meta = {"nodes": 2, "gpus_per_node": 2, "gpu_model": "T4"}
    return Cluster(Layout(tmp_path), tmp_path, Ports(*range(1, 8)), {}, processes=procs, meta=meta)


def test_summary_shows_kubeconfig_examples_and_gpunodes(tmp_path: Path) -> None:
    cluster = fake_cluster(tmp_path, ["etcd", "kube-apiserver", "gpupack-extender", "gpupack-webhook"])
    text = command._summary(cluster)
    kubectl = f"kubectl --kubeconfig {tmp_path / 'kubeconfig'}"
    assert f"kubeconfig: {tmp_path / 'kubeconfig'}" in text
    assert f"{kubectl} create -f {REPO / 'deploy/examples/fraction-pod.yaml'}" in text
    assert f"{kubectl} create -f {REPO / 'deploy/examples/memory-pod.yaml'}" in text
    assert f"{kubectl} get gpunodes" in text
    assert "gpupack: gpupack-extender(102) gpupack-webhook(103)" in text


def test_summary_without_components_says_so(tmp_path: Path) -> None:
    text = command._summary(fake_cluster(tmp_path, ["etcd", "kube-apiserver", "kube-scheduler", "kwok"]))
    assert "--no-components" in text and "fraction-pod.yaml" not in text


# ---- the examples the summary points at ----


@pytest.mark.parametrize(
    ("name", "resource", "amount"),
    [
        ("fraction-pod.yaml", names.RESOURCE_GPU_MILLI, 500),
        ("memory-pod.yaml", names.RESOURCE_GPU_MEMORY_MIB, 4096),
    ],
)
def test_examples_are_valid_requests_with_nothing_but_the_annotation(
    name: str, resource: str, amount: int
) -> None:
    pod = yaml.safe_load((REPO / "deploy/examples" / name).read_text())
    assert pod["kind"] == "Pod" and "generateName" in pod["metadata"]  # `kubectl create` twice works
    parsed = request.parse(podview.read(pod))
    assert isinstance(parsed, request.GpuRequest), parsed
    assert parsed.resource == (resource, amount)
    for container in pod["spec"]["containers"]:
        assert "resources" not in container and "env" not in container  # the webhook adds them


# ---- starting several components together ----


def test_start_processes_is_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.devcluster import processes
    from tests.devcluster.processes import ComponentError, ComponentSpec, HealthCheck

    launched: list[ManagedProcess] = []
    real_start = processes.start

    def spy(spec: ComponentSpec, log_path: Path) -> ManagedProcess:
        launched.append(real_start(spec, log_path))
        return launched[-1]

    monkeypatch.setattr("tests.devcluster.cluster.start_process_only", spy)
    cluster = Cluster(Layout(tmp_path), tmp_path, Ports(*range(1, 8)), {})
    sleeper = ComponentSpec("sleeper", (sys.executable, "-c", "import time; time.sleep(60)"))
    failing = ComponentSpec(
        "failing",
        (sys.executable, "-c", "raise SystemExit('no config')"),
        health=HealthCheck("http://127.0.0.1:9/healthz"),  # never answers: only its exit ends the wait
        ready_timeout_s=30,
    )
    with pytest.raises(ComponentError, match=r"failing exited \(code 1\)[\s\S]*no config"):
        cluster.start_processes([sleeper, failing])
    assert [p.name for p in launched] == ["sleeper", "failing"]
    assert not any(p.alive() for p in launched)  # the healthy one was stopped too
    assert cluster.processes == []


def test_the_dev_cluster_runs_the_charts_node_side_runtime_class() -> None:
    """As the chart's default (nodeSide.enabled): its RuntimeClass exists, the webhook sets it on MPS pods."""
    rc = addons.runtime_class(manifest_docs())
    assert rc is not None and (rc["apiVersion"], rc["kind"]) == ("node.k8s.io/v1", "RuntimeClass")
    chart_values = yaml.safe_load((REPO / "deploy/helm/gpupack/values.yaml").read_text())
    assert rc["metadata"]["name"] == chart_values["nodeSide"]["runtimeClassName"]
    assert rc["handler"] == chart_values["nodeSide"]["handler"]
    assert addons.Components.runtime_class_name() == rc["metadata"]["name"]
    assert addons.Components().node_side is True


def test_the_real_nodes_node_side_runs_as_the_charts_daemonsets_do(tmp_path: Path) -> None:
    """Each host process of the real node's node side parses with the real CLI, with the chart's flags."""
    side = nodeside.NodeSide("real", tmp_path, tmp_path / "bin", REPO / nodeside.STANDIN_MPS_RELPATH)
    spec = addons.agent_spec(
        "real",
        sim=tmp_path / "s.yaml",
        port=3333,
        kubeconfig=tmp_path / "a",
        state_dir=tmp_path,
        node_side=side.agent_flags(),
    )
    agent = parse_cli(spec.argv)
    assert agent.mps is not False  # MPS on: the agent adopts the node's daemon
    assert (agent.node_socket, agent.mps_pipe_dir, agent.sim_state) == (
        tmp_path / "node-side" / "agent.sock",
        tmp_path / "mps-pipe",
        tmp_path / "sim-state" / "real",
    )
    assert agent.mps_binary == str(REPO / "tests/standin/mps_control.py")
    prep = parse_cli(side.prepare_argv(tmp_path / "s.yaml"))
    assert (prep.pipe_dir, prep.compute_mode, prep.node) == (tmp_path / "mps-pipe", "keep", "real")
    installer = parse_cli(side.installer_spec(tmp_path / "gpupack-runc", tmp_path / "kubeconfig").argv)
    assert (installer.install_dir, installer.socket, installer.state_dir, installer.runtime) == (
        tmp_path / "bin",
        side.socket,
        side.state_dir,
        "runc",
    )
    daemon = side.mps_daemon_spec()
    assert daemon.argv[1:] == (str(REPO / "tests/standin/mps_control.py"), "-f", "-M")
    assert daemon.env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps-pipe")
