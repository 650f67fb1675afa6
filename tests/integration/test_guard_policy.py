"""The chart's runtime-class ValidatingAdmissionPolicy (nodeSide.guard.refusedRuntimeClasses) on the real
apiserver: a pod naming a refused RuntimeClass, which would run past the node's guard, is refused outside
the guard's exempt namespaces and pods, with the class, the namespace and the way out in the message; every
other pod is admitted as before. The policy is rendered by helm with the values an operator sets, and its
binding is narrowed to this test's namespaces (the apiserver is shared with other modules)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from test_deploy import render

from tests.devcluster import wait_for
from tests.devcluster.addons import create, install_policies

REPO = Path(__file__).resolve().parents[2]
REFUSED = "nvidia"


@dataclass(frozen=True)
class Namespaces:
    guarded: str
    exempt: str


@pytest.fixture(scope="module")
def helm_path() -> str:
    out = subprocess.run(
        [str(REPO / "tests/helm/build.sh")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return out.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def policy(kube: Any, helm_path: str) -> Iterator[Namespaces]:
    """The policy as `helm template` renders it for an operator's values, bound to two new namespaces."""
    suffix = uuid.uuid4().hex[:6]
    ns = Namespaces(f"guarded-{suffix}", f"monitoring-{suffix}")
    core = client.CoreV1Api(kube)
    for name in (ns.guarded, ns.exempt):
        core.create_namespace({"metadata": {"name": name}})
    node_api = client.NodeV1Api(kube)
    existing = {rc.metadata.name for rc in node_api.list_runtime_class().items}
    made = [name for name in (REFUSED, "gpupack") if name not in existing]
    for name in made:  # the admission plugin refuses a pod of a class that does not exist
        create(kube, {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
                      "handler": name})  # fmt: skip
    docs = render(
        helm_path, "gp", "gpupack-system",
        (f"nodeSide.guard.refusedRuntimeClasses={{{REFUSED}}}",
         f"nodeSide.guard.exemptNamespaces={{gpu-operator,{ns.exempt}}}",
         f"nodeSide.guard.exemptPods={{{ns.guarded}/dcgm-exporter-}}"),
    )  # fmt: skip
    objs = [d for d in docs if d["metadata"]["name"] == "gp-gpupack-runtime-class"]
    assert [o["kind"] for o in objs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    policy, binding = objs
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert selector == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
         "values": ["gpupack-system", "gpu-operator", ns.exempt]}
    ]  # fmt: skip
    # Narrowed to this test's namespaces: the rendered NotIn still decides between them.
    selector.append(
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns.guarded, ns.exempt]}
    )
    binding["metadata"]["name"] += f"-{suffix}"
    policy["metadata"]["name"] += f"-{suffix}"
    binding["spec"]["policyName"] = policy["metadata"]["name"]
    install_policies(kube, [policy, binding])
    wait_for(
        lambda: isinstance(admit(core, ns.guarded, "probe", REFUSED), str),
        30,
        "the runtime-class policy in effect",
        interval=0.2,
    )
    try:
        yield ns
    finally:
        api = client.AdmissionregistrationV1Api(kube)
        api.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        api.delete_validating_admission_policy(policy["metadata"]["name"])
        for name in (ns.guarded, ns.exempt):
            core.delete_namespace(name)
        for name in made:  # the shared control plane as this module found it (the chart installs "gpupack")
            node_api.delete_runtime_class(name)


def admit(core: Any, namespace: str, name: str, runtime_class: str | None) -> str | None:
    """Create the pod (dry run); None when admitted, else the apiserver's message."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda"}]}
    if runtime_class is not None:
        spec["runtimeClassName"] = runtime_class
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    try:
        core.create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as exc:
        assert exc.status in (403, 422), (exc.status, exc.body)
        return str(json.loads(exc.body)["message"])
    return None


def test_a_pod_naming_a_refused_runtime_class_is_refused_with_the_way_out(
    kube: Any, policy: Namespaces
) -> None:
    message = admit(client.CoreV1Api(kube), policy.guarded, "train", REFUSED)
    assert message is not None
    assert f"spec.runtimeClassName: {REFUSED} is not allowed in namespace {policy.guarded}" in message
    assert "nodeSide.guard.exemptNamespaces" in message and "remove spec.runtimeClassName" in message


@pytest.mark.parametrize(
    ("where", "name", "runtime_class"),
    [
        ("guarded", "plain", None),  # the node's default runtime: the guard sees it
        ("guarded", "share", "gpupack"),  # gpupack's own RuntimeClass
        ("exempt", "dcgm", REFUSED),  # an exempt namespace
        ("guarded", "dcgm-exporter-x7k2", REFUSED),  # an exempt pod prefix
    ],
    ids=["no-class", "gpupack-class", "exempt-namespace", "exempt-pod"],
)
def test_every_other_pod_is_admitted(
    kube: Any, policy: Namespaces, where: str, name: str, runtime_class: str | None
) -> None:
    namespace = policy.guarded if where == "guarded" else policy.exempt
    assert admit(client.CoreV1Api(kube), namespace, name, runtime_class) is None


def test_a_pod_of_the_prefixs_namespace_not_named_by_it_is_refused(kube: Any, policy: Namespaces) -> None:
    assert admit(client.CoreV1Api(kube), policy.guarded, "exporter-dcgm", REFUSED) is not None
