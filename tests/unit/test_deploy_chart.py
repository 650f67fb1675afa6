"""The chart's copies and its rendered manifests agree with the files the other parts of gpupack own.

deploy/manifests/gpupack.yaml is the chart rendered with default values (tests/helm/render.py; the
integration tier checks it equals a fresh render), so these checks cover the chart without a helm binary.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import build_parser
from app.core import names, nearmiss
from app.core.podview import ask_of
from tests.devcluster import schedconfig

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy/helm/gpupack"
MANIFEST = REPO / "deploy/manifests/gpupack.yaml"
NS = "gpupack-system"
GPUPACK_IMAGE = "ghcr.io/gpupack/gpupack:"

# The user's request annotations, in the order DESIGN.md lists them.
REQUEST_KEYS = (
    names.GPU_FRACTION,
    names.GPU_MEMORY,
    names.MIG_PROFILE,
    names.GPU_FRACTION_NUM_DEVICES,
    names.GPU_FRACTION_CONTAINER_NAME,
    names.GPU_MODEL,
    names.ISOLATION,
    names.GPU_MEMORY_LIMIT,
)


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} in the manifest"
    return hits[0]


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(workload name, pod spec, container) for every container (init containers too) of every workload."""
    for o in objects:
        if o["kind"] in ("Deployment", "DaemonSet"):
            spec = o["spec"]["template"]["spec"]
            for c in [*spec.get("initContainers", []), *spec["containers"]]:
                yield o["metadata"]["name"], spec, c


@pytest.mark.parametrize(
    ("source", "copy_"),
    [
        ("deploy/crds/gpunodes.gpupack.io.yaml", "deploy/helm/gpupack/crds/gpunodes.gpupack.io.yaml"),
        (
            "deploy/scheduler/kube-scheduler-config.yaml",
            "deploy/helm/gpupack/files/kube-scheduler-config.yaml",
        ),
        (
            "deploy/webhook/mutatingwebhookconfiguration.yaml",
            "deploy/helm/gpupack/files/mutatingwebhookconfiguration.yaml",
        ),
    ],
    ids=["crd", "scheduler-config", "webhook-config"],
)
def test_chart_copies_are_identical_to_their_sources(source: str, copy_: str) -> None:
    assert (REPO / copy_).read_bytes() == (REPO / source).read_bytes(), (
        f"{copy_} differs from {source}: run python tests/helm/render.py"
    )


def test_manifest_crd_is_the_agents_crd(objects: list[dict[str, Any]]) -> None:
    crd = find(objects, "CustomResourceDefinition", "gpunodes.gpupack.io")
    assert crd == load(REPO / "deploy/crds/gpunodes.gpupack.io.yaml")


def test_scheduler_config_is_the_integration_tests_config(objects: list[dict[str, Any]]) -> None:
    """Same template, same renderer as the harness; only the deployment's own settings differ."""
    cm = find(objects, "ConfigMap", "gpupack-scheduler-config")
    got = yaml.safe_load(cm["data"]["kube-scheduler-config.yaml"])
    want = schedconfig.render(
        schedconfig.template_path(REPO).read_text(),
        kubeconfig="",  # in-cluster
        extender_url=f"https://gpupack-extender.{NS}.svc:8888",
        tls=schedconfig.CHART_TLS,  # where the scheduler pods mount Secret gpupack-scheduler-client
        overrides={"leaderElection": {"resourceName": "gpupack-scheduler", "resourceNamespace": NS}},
    )
    for profile in want["profiles"]:
        profile["schedulerName"] = "gpupack-scheduler"
    assert got == want


def test_second_scheduler_never_shares_the_default_schedulers_lease(objects: list[dict[str, Any]]) -> None:
    cm = find(objects, "ConfigMap", "gpupack-scheduler-config")
    conf = yaml.safe_load(cm["data"]["kube-scheduler-config.yaml"])
    assert conf["leaderElection"]["resourceName"] != "kube-scheduler"
    assert [p["schedulerName"] for p in conf["profiles"]] == ["gpupack-scheduler"]
    deploy = find(objects, "Deployment", "gpupack-scheduler")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--config=/etc/gpupack-scheduler/kube-scheduler-config.yaml" in args
    webhook = find(objects, "Deployment", "gpupack-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert "--scheduler-name=gpupack-scheduler" in webhook["args"]


def test_webhook_configuration_is_the_webhook_contract(objects: list[dict[str, Any]]) -> None:
    got = find(objects, "MutatingWebhookConfiguration", "gpupack-webhook")
    want = copy.deepcopy(load(REPO / "deploy/webhook/mutatingwebhookconfiguration.yaml"))
    # the manifest is rendered with certs.mode=certManager: cert-manager injects the caBundle
    assert got["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NS}/gpupack-webhook"}
    for hook in want["webhooks"]:
        del hook["clientConfig"]["caBundle"]
    assert got["webhooks"] == want["webhooks"]
    svc = find(objects, "Service", "gpupack-webhook")
    hook_svc = got["webhooks"][0]["clientConfig"]["service"]
    assert (hook_svc["name"], hook_svc["namespace"]) == (
        svc["metadata"]["name"],
        svc["metadata"]["namespace"],
    )
    assert hook_svc["port"] in [p["port"] for p in svc["spec"]["ports"]]


def test_agent_daemonset_matches_the_agents_own(objects: list[dict[str, Any]]) -> None:
    ref = load(REPO / "deploy/agent/daemonset.yaml")["spec"]["template"]["spec"]
    got = find(objects, "DaemonSet", "gpupack-agent")["spec"]["template"]["spec"]
    for key in ("hostIPC", "hostPID", "nodeSelector", "tolerations", "priorityClassName"):
        assert got.get(key) == ref.get(key), key
    rc, gc = ref["containers"][0], got["containers"][0]
    assert set(rc["args"]) <= set(gc["args"]), sorted(set(rc["args"]) - set(gc["args"]))
    assert gc["env"] == rc["env"]
    assert gc["volumeMounts"] == rc["volumeMounts"]
    assert {v["name"]: v["hostPath"] for v in got["volumes"]} == {
        v["name"]: v["hostPath"] for v in ref["volumes"]
    }
    for key in ("runAsUser", "capabilities"):
        assert gc["securityContext"][key] == rc["securityContext"][key], key
    assert gc["resources"] == rc["resources"]


def test_mps_daemon_matches_its_plain_manifest_and_never_rolls(objects: list[dict[str, Any]]) -> None:
    ref = next(
        d
        for d in yaml.safe_load_all((REPO / "deploy/agent/mps-daemon.yaml").read_text())
        if d["kind"] == "DaemonSet"
    )["spec"]
    got = find(objects, "DaemonSet", "gpupack-mps-daemon")["spec"]
    assert got["updateStrategy"] == ref["updateStrategy"] == {"type": "OnDelete"}
    rt, gt = ref["template"]["spec"], got["template"]["spec"]
    assert gt["hostPID"] is rt["hostPID"] is True  # clients are known by their host pid
    for key in ("hostIPC", "nodeSelector", "tolerations", "priorityClassName", "volumes"):
        assert gt[key] == rt[key], key
    for kind in ("initContainers", "containers"):
        for rc, gc in zip(rt[kind], gt[kind], strict=True):
            for key in ("args", "command", "env", "volumeMounts", "securityContext", "resources"):
                assert gc.get(key) == rc.get(key), (kind, key)
    (daemon,) = gt["containers"]
    assert daemon["command"] == ["nvidia-cuda-mps-control", "-f", "-M"]  # foreground, multi-user
    # Closed by default (docs/node-side.md): idle MPS GPUs in EXCLUSIVE_PROCESS before the daemon starts,
    # kept there by the agent, which starts a server before any client (no --no-mps-prestart-server).
    (prepare,) = gt["initContainers"]
    assert "--compute-mode=exclusive-process" in prepare["args"]
    args = find(objects, "DaemonSet", "gpupack-agent")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--mps-exclusive-process" in args and "--no-mps-prestart-server" not in args
    agent = find(objects, "DaemonSet", "gpupack-agent")["spec"]["template"]["spec"]
    assert "hostIPC" not in agent  # the agent holds no part of MPS any more
    pipe = next(v for v in gt["volumes"] if v["name"] == "mps-pipe")
    assert pipe in agent["volumes"]  # the agent reaches the same control pipe


def test_node_side_matches_its_plain_manifest_and_exempts_the_release_from_the_guard(
    objects: list[dict[str, Any]],
) -> None:
    ref = next(
        d
        for d in yaml.safe_load_all((REPO / "deploy/agent/node-side.yaml").read_text())
        if d["kind"] == "DaemonSet"
    )["spec"]["template"]["spec"]
    got = find(objects, "DaemonSet", "gpupack-node-side")["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "priorityClassName", "volumes"):
        assert got[key] == ref[key], key
    (rc,), (gc,) = ref["containers"], got["containers"]
    for key in ("args", "volumeMounts", "securityContext", "resources"):
        assert gc[key] == rc[key], key
    args = build_parser().parse_args(gc["args"])
    # The guard is on by default, and gpupack's own pods (the agent, the MPS daemon) are never voided.
    assert args.guard is True
    assert args.exempt_namespace[0] == NS and "gpu-operator" in args.exempt_namespace


def test_agent_rbac_matches_the_agents_own(objects: list[dict[str, Any]]) -> None:
    ref = [d for d in yaml.safe_load_all((REPO / "deploy/agent/rbac.yaml").read_text()) if d]
    ref_rules = next(d for d in ref if d["kind"] == "ClusterRole")["rules"]
    got_rules = find(objects, "ClusterRole", "gpupack-agent")["rules"]
    eviction = {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
    # pods/eviction: the watchdog evicts a pod that keeps breaking its allocation (agent.watchdog.evictAfter)
    assert got_rules == ref_rules
    assert eviction in ref_rules


def test_component_command_lines_parse_with_the_real_cli(objects: list[dict[str, Any]]) -> None:
    parser = build_parser()
    seen = set()
    for _, _, c in containers(objects):
        if not c["image"].startswith(GPUPACK_IMAGE) or "args" not in c:
            continue  # (the MPS daemon runs NVIDIA's binary, mounted by the NVIDIA runtime)
        args = parser.parse_args(c["args"])
        seen.add((args.command, c["args"][1]))
        assert args.func, shlex.join(c["args"])
    assert seen == {
        ("webhook", "serve"),
        ("extender", "serve"),
        ("agent", "run"),
        ("agent", "prepare-mps"),
        ("agent", "handler"),
    }


def test_extender_lease_matches_its_rbac(objects: list[dict[str, Any]]) -> None:
    c = find(objects, "Deployment", "gpupack-extender")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(c["args"])
    role = find(objects, "Role", "gpupack-extender-leader-election")
    assert role["metadata"]["namespace"] == args.lease_namespace
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [args.lease_name],
            "verbs": ["get", "update"],
        }
    ]


def test_every_container_is_locked_down_and_sized(objects: list[dict[str, Any]]) -> None:
    for name, pod, c in containers(objects):
        sc = c["securityContext"]
        res = c["resources"]
        assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"], name
        assert sc["readOnlyRootFilesystem"] is True, name
        assert sc["capabilities"]["drop"] == ["ALL"], name
        if name == "gpupack-agent":
            # /proc of other containers, their env (container-start check), the watchdog: see values.yaml
            assert sc["capabilities"].get("add") == ["SYS_ADMIN", "SYS_PTRACE", "KILL"]
            continue
        if name == "gpupack-node-side":
            # root to write the root-owned host dirs of the runtime handler, and nothing else
            assert sc["runAsUser"] == 0 and "add" not in sc["capabilities"], name
            assert sc["allowPrivilegeEscalation"] is False, name
            continue
        if name == "gpupack-mps-daemon":
            # root: the multi-user daemon and compute modes; per-uid servers without -M: see values.yaml
            assert sc["runAsUser"] == 0 and sc["capabilities"].get("add") == ["SETUID", "SETGID", "KILL"]
            continue
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert sc["allowPrivilegeEscalation"] is False, name
        assert "add" not in sc["capabilities"], name


def test_every_service_account_exists_and_webhook_only_reads_gpunodes(objects: list[dict[str, Any]]) -> None:
    sas = {
        (o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects if o["kind"] == "ServiceAccount"
    }
    for o in objects:
        if o["kind"] in ("Deployment", "DaemonSet"):
            spec = o["spec"]["template"]["spec"]
            assert (o["metadata"]["namespace"], spec["serviceAccountName"]) in sas
        if o["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            for s in o["subjects"]:
                assert (s["namespace"], s["name"]) in sas, o["metadata"]["name"]
    webhook = find(objects, "Deployment", "gpupack-webhook")["spec"]["template"]["spec"]
    # its token reads the GPUNodes a fraction's quota charge comes from (webhook.readGpuNodes), nothing else
    assert webhook["automountServiceAccountToken"] is True
    assert "--read-gpunodes" in webhook["containers"][0]["args"]
    roles = {
        o["roleRef"]["name"]
        for o in objects
        if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
        for s in o["subjects"]
        if s["name"] == "gpupack-webhook"
    }
    assert roles == {"gpupack-webhook"}
    assert find(objects, "ClusterRole", "gpupack-webhook")["rules"] == [
        {"apiGroups": ["gpupack.io"], "resources": ["gpunodes"], "verbs": ["get", "list", "watch"]}
    ]


def test_disruption_budgets_select_their_workloads(objects: list[dict[str, Any]]) -> None:
    budgets = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert {b["metadata"]["name"] for b in budgets} == {"gpupack-webhook", "gpupack-scheduler"}
    for b in budgets:
        workload = find(objects, "Deployment", b["metadata"]["name"])
        assert b["spec"]["selector"] == workload["spec"]["selector"]
        assert workload["spec"]["replicas"] > b["spec"]["minAvailable"]


def _cel_list(policy: dict[str, Any], variable: str) -> list[str]:
    """A CEL list-of-strings literal from the policy's variables, e.g. ['a', 'b'] -> ["a", "b"]."""
    (expr,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == variable]
    return re.findall(r"'([^']*)'", expr)


def _service_account_user(objects: list[dict[str, Any]], kind: str, name: str) -> str:
    spec = find(objects, kind, name)["spec"]["template"]["spec"]
    return f"system:serviceaccount:{NS}:{spec['serviceAccountName']}"


def test_pod_allocation_policy_guards_exactly_our_keys_for_the_extenders_identity(
    objects: list[dict[str, Any]],
) -> None:
    policy = find(objects, "ValidatingAdmissionPolicy", "gpupack-pod-allocation")
    assert _cel_list(policy, "allocationKeys") == list(names.ALLOCATION_ANNOTATIONS)
    assert _cel_list(policy, "requestKeys") == list(REQUEST_KEYS)
    (is_extender,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "isExtender"]
    extender = _service_account_user(objects, "Deployment", "gpupack-extender")
    assert is_extender == f"request.userInfo.username == '{extender}'"
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["pods", "pods/status"],
        }
    ]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert all(v.get("reason") == "Forbidden" for v in policy["spec"]["validations"])
    assert any(names.LABEL_MANAGED in v["expression"] for v in policy["spec"]["validations"])


def test_agent_policy_matches_the_agents_identity_and_node_name_extra(objects: list[dict[str, Any]]) -> None:
    policy = find(objects, "ValidatingAdmissionPolicy", "gpupack-agent-own-node")
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        f"request.userInfo.username == '{_service_account_user(objects, 'DaemonSet', 'gpupack-agent')}'"
    )
    resources = {r for rule in policy["spec"]["matchConstraints"]["resourceRules"] for r in rule["resources"]}
    assert resources == {"nodes", "nodes/status", "gpunodes", "gpunodes/status"}
    assert "authentication.kubernetes.io/node-name" in json.dumps(policy["spec"]["variables"])


def test_quota_policy_refuses_new_limits_on_the_placement_resources_naming_the_quota_ones(
    objects: list[dict[str, Any]],
) -> None:
    policy = find(objects, "ValidatingAdmissionPolicy", "gpupack-quota-resources")
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["resourcequotas"],
        }
    ]
    (keys,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "placementKeys"]
    for resource in (names.RESOURCE_GPU_MILLI, names.RESOURCE_GPU_MEMORY_MIB):
        assert f"k.endsWith('{resource}')" in keys
    (validation,) = policy["spec"]["validations"]
    for resource in (names.RESOURCE_QUOTA_GPU_MILLI, names.RESOURCE_QUOTA_GPU_MEMORY_MIB):
        assert f"requests.{resource}" in validation["messageExpression"]
    assert validation["reason"] == "Invalid"


def test_every_policy_has_a_denying_binding(objects: list[dict[str, Any]]) -> None:
    policies = {o["metadata"]["name"] for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert policies == {
        "gpupack-pod-allocation",
        "gpupack-agent-own-node",
        "gpupack-quota-resources",
        "gpupack-mps-pipe-dir",
    }
    assert {b["spec"]["policyName"] for b in bindings} == policies
    assert all(
        b["spec"]["validationActions"] == ["Deny"] and "matchResources" not in b["spec"] for b in bindings
    )


def test_webhook_is_called_for_pods_with_our_resources_and_no_annotation() -> None:
    """Without this, a pod requesting gpupack.io/* directly would skip the webhook's refusal."""
    hook = load(REPO / "deploy/webhook/mutatingwebhookconfiguration.yaml")["webhooks"][0]
    (condition,) = hook["matchConditions"]
    expr = condition["expression"]
    for needle in (
        "object.spec.containers.exists(",
        "object.spec.initContainers.exists(",
        "requests",
        "limits",
    ):
        assert needle in expr
    assert expr.count("k.startsWith('gpupack.io/')") == 4


def test_webhook_is_called_for_every_key_that_asks_for_a_share_and_for_gpu_like_near_misses() -> None:
    """The annotation clause matches a key containing "gpu" in any case (app.core.nearmiss.gpu_like): every
    key whose presence makes a pod ask for a share has it, so none can skip the webhook."""
    hook = load(REPO / "deploy/webhook/mutatingwebhookconfiguration.yaml")["webhooks"][0]
    (condition,) = hook["matchConditions"]
    assert "object.metadata.annotations.exists(k, k.matches('[Gg][Pp][Uu]'))" in condition["expression"]
    asking = [
        names.GPU_FRACTION,
        names.GPU_MEMORY,
        names.MIG_PROFILE,
        names.GPU_MEMORY_LIMIT,
        names.KAI_FRACTION_LIMIT,
        names.KAI_GPU_MEMORY_LIMIT,
        f"{names.KAI_CONTAINER_PREFIX}main.{names.KAI_MEMORY_REQUEST}",
        f"{names.KAI_CONTAINER_PREFIX}main.{names.KAI_MEMORY_LIMIT}",
        f"{names.KAI_PORTION_PREFIX}main.{names.KAI_PORTION_LIMIT}",
    ]
    for key in asking:
        assert ask_of({key: "1"}).wanted, key
        assert nearmiss.gpu_like(key), key
    assert all(nearmiss.gpu_like(k) for k in ("gpu_fraction", "GPU-Fraction", "nvidia.com/use-gputype"))


def _enums(schema: Any, path: str = "") -> Iterator[tuple[str, list[Any]]]:
    if isinstance(schema, dict):
        if "enum" in schema:
            yield path, schema["enum"]
        for key, value in schema.items():
            yield from _enums(value, f"{path}.{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from _enums(value, f"{path}[{i}]")


def test_the_gpunode_crd_enums_are_the_values_the_agent_writes() -> None:
    # YAML 1.1 reads an unquoted off/on/yes/no as a boolean: the apiserver would then refuse the agent's
    # "off" with a 422 and the node's status would never be written.
    from app.core.isolation import ComputeEnforcement, MemoryEnforcement, Sharing

    crd = load(REPO / "deploy/crds/gpunodes.gpupack.io.yaml")
    enums = dict(_enums(crd))
    for where, values in enums.items():
        assert all(isinstance(v, str) for v in values), (where, values)
    by_leaf = {where.rsplit(".", 2)[-1]: set(values) for where, values in enums.items()}
    assert by_leaf["mpsMode"] == {s.value for s in Sharing}
    assert by_leaf["memory"] == {m.value for m in MemoryEnforcement}
    assert by_leaf["compute"] == {c.value for c in ComputeEnforcement}
