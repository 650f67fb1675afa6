"""gpupack's own components in `make dev`: CRD + RBAC, then the extender, the webhook, the agents.

An addon is started after the control plane is healthy and the fake GPU nodes are Ready. It starts its
processes with `cluster.start_process(ComponentSpec(...))` (or `start_processes` for several at once) - so
they are health-checked, logged to DIR/logs/<name>.log, recorded in DIR/state.json and stopped by
`make down` - and may then create API objects as admin (`cluster.api_client()`). The dev cluster
does not import webhook/extender/agent (import-linter contract): an addon runs them as commands
(`sys.executable -m app.cli ...`), the way a real install runs the image.

The addons, in order:

* Definitions: the GPUNode CRD from deploy/crds/, and the extender/webhook/agent RBAC objects and
  ValidatingAdmissionPolicies (+ bindings) of the rendered chart deploy/manifests/gpupack.yaml - the objects
  a real install creates; done once a dry-run pod with an allocation annotation is denied. The components
  authenticate as the ServiceAccounts gpupack-system/gpupack-{extender,webhook,agent} (identities.py), so
  the chart's bindings apply unchanged and a permission the chart lacks fails here as in a real cluster.
* Components, launched together and each health-checked:
  - extender on 127.0.0.1:`cluster.extender_port` (already the urlPrefix in the scheduler config; HTTPS,
    kube-scheduler's client certificate required) with probes and metrics on `cluster.extender_ops_port`,
    kubeconfig gpupack-extender; healthy when /readyz says it leads and its informers synced.
  - webhook over HTTPS on 127.0.0.1:`cluster.webhook_port` with the harness's serving cert; then the
    MutatingWebhookConfiguration of deploy/webhook/ with url + caBundle, polled with a dry-run pod create
    until the mutation shows (the apiserver picks configurations up asynchronously).
  - one `agent run --sim` per node, kubeconfig DIR/agents/<node>.kubeconfig: a gpupack-agent token bound
    to a stand-in pod on that node (TokenRequest), so it carries the node-name extra the agent-own-node
    policy checks (static token-file users cannot carry extras), with a simulated GPU set of the node's
    model and count: a sample from agent/data/sim/ when one is exactly that idle shape, else generated
    into DIR/sim/. The simulator derives GPU UUIDs from the node name, so one file serves every node of a
    shape. Done once every node's GPUNode is published.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from app.core import catalog, names
from app.core.errors import KubeError
from app.kube import calls, paths
from app.kube.calls import JsonDict, Request
from app.kube.client import Kube

from .admission import webhook_configuration
from .binaries import repo_root
from .identities import GPUPACK_NAMESPACE, kubeconfig
from .nodes import MigLayout
from .nodeside import NodeSide, build_handler, prepare
from .poll import WaitTimeoutError, wait_for
from .ports import free_ports
from .processes import ComponentSpec, HealthCheck

if TYPE_CHECKING:
    from .cluster import Cluster

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


CRD_RELPATH = Path("deploy/crds/gpunodes.gpupack.io.yaml")
MANIFEST_RELPATH = Path("deploy/manifests/gpupack.yaml")
WEBHOOK_CONFIG_RELPATH = Path("deploy/webhook/mutatingwebhookconfiguration.yaml")
SIM_SAMPLES_RELPATH = Path("agent/data/sim")

EXTENDER = "gpupack-extender"
WEBHOOK = "gpupack-webhook"
AGENT_PREFIX = "gpupack-agent-"
AGENT_SERVICE_ACCOUNT = "gpupack-agent"
AGENT_TOKEN_SECONDS = 7 * 24 * 3600  # a dev cluster rarely lives a week; `dev up` again mints new ones
# The chart labels every object with the component it belongs to; the dev cluster runs these three
# (its kube-scheduler runs as system:kube-scheduler, so the chart's scheduler bindings are not needed).
COMPONENTS = ("extender", "webhook", "agent")
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# The API group of each kind `_install` takes, for objects written without their apiVersion.
_API_VERSIONS = dict.fromkeys(RBAC_KINDS, "rbac.authorization.k8s.io/v1") | dict.fromkeys(
    POLICY_KINDS, "admissionregistration.k8s.io/v1"
)
COMPONENT_LABEL = "app.kubernetes.io/component"
# Namespaces the webhook configuration excludes are no good for the probe; `default` always exists.
PROBE_NAMESPACE = "default"


def gpupack_cli(*args: str) -> tuple[str, ...]:
    """argv running `gpupack ...` with this interpreter: the venv `dev up` runs from, no PATH lookup."""
    return (sys.executable, "-m", "app.cli", *args)


def source_file(relpath: Path) -> Path:
    root = repo_root()
    if root is None or not (root / relpath).is_file():
        raise FileNotFoundError(f"{relpath} not found: the dev cluster runs gpupack from a source checkout")
    return root / relpath


# ---- pure parts (unit-tested) ----


def rbac_objects(docs: Iterable[Any], components: Sequence[str] = COMPONENTS) -> list[dict[str, Any]]:
    """The RBAC objects of `components` among rendered manifests, in file order (roles before bindings)."""
    out = []
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") not in RBAC_KINDS:
            continue
        labels = (doc.get("metadata") or {}).get("labels") or {}
        if labels.get(COMPONENT_LABEL) in components:
            out.append(doc)
    # Creating a binding before its role is fine for RBAC, but roles first reads better in an audit log.
    return sorted(out, key=lambda d: "Binding" in d["kind"])


def policy_objects(docs: Iterable[Any], components: Sequence[str] = COMPONENTS) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicies of `components` and their bindings, policies first."""
    out = [
        doc
        for doc in docs
        if isinstance(doc, dict)
        and doc.get("kind") in POLICY_KINDS
        and ((doc.get("metadata") or {}).get("labels") or {}).get(COMPONENT_LABEL) in components
    ]
    # A binding whose policy does not exist yet is ignored until it does; policies first avoids the gap.
    return sorted(out, key=lambda d: d["kind"].endswith("Binding"))


def scoped_binding(
    binding: Mapping[str, Any], *, namespace: str | None = None, object_names: Sequence[str] = ()
) -> dict[str, Any]:
    """A copy of a policy binding limited to one namespace and/or to named objects, under its own name.

    The integration tier shares one apiserver between test modules: a test binds gpupack's policies
    only to its own namespace or nodes, so the other modules' fixtures (pods created as the webhook
    would leave them, agents with unbound tokens) keep working beside it.
    """
    if namespace is None and not object_names:
        raise ValueError("scoped_binding needs a namespace or object names (else it binds cluster-wide)")
    out = copy.deepcopy(dict(binding))
    suffix = namespace or "-".join(object_names)
    out["metadata"] = {**out["metadata"], "name": f"{out['metadata']['name']}-{suffix}"[:253]}
    match: dict[str, Any] = {}
    if namespace is not None:
        match["namespaceSelector"] = {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [namespace]}
            ]
        }
    if object_names:
        match["resourceRules"] = [
            {
                "apiGroups": ["*"],
                "apiVersions": ["*"],
                "operations": ["*"],
                "resources": ["*/*"],  # resources and their subresources (nodes/status)
                "resourceNames": list(object_names),
            }
        ]
    out["spec"] = {**out["spec"], "matchResources": match}
    return out


def allocation_probe_pod(name: str = "gpupack-policy-probe") -> dict[str, Any]:
    """A pod with an allocation annotation: the pod-allocation policy denies it to all but the extender."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {names.ALLOC_NODE: "probe"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def runtime_class(docs: Iterable[Any]) -> dict[str, Any] | None:
    """The chart's RuntimeClass (its node side, on by default) among rendered manifests: the webhook sets it
    on MPS pods, so an MPS share needs no hostPath and runs in `baseline` namespaces."""
    return next(
        (
            doc
            for doc in docs
            if isinstance(doc, dict)
            and doc.get("kind") == "RuntimeClass"
            and ((doc.get("metadata") or {}).get("labels") or {}).get(COMPONENT_LABEL) == "node-side"
        ),
        None,
    )


def agent_anchor_pod(node: str, service_account: str = AGENT_SERVICE_ACCOUNT) -> dict[str, Any]:
    """The stand-in for a node's agent DaemonSet pod: what its ServiceAccount token gets bound to.

    A token bound to a pod that runs on a node carries that node's name in the user's extra
    `authentication.kubernetes.io/node-name`, which the agent-own-node admission policy checks.
    """
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{AGENT_PREFIX}{node}"[:253],
            "namespace": GPUPACK_NAMESPACE,
            "labels": {COMPONENT_LABEL: "agent"},
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,
            "containers": [{"name": "agent", "image": "gpupack"}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


def bound_token_request(pod_name: str, pod_uid: str, expiration_s: int) -> dict[str, Any]:
    """A TokenRequest for a ServiceAccount token bound to (and valid only while) that pod exists."""
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": expiration_s,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod_name, "uid": pod_uid},
        },
    }


def sim_document(model: str, count: int, mig: MigLayout | None = None) -> dict[str, Any]:
    """A simulated GPU set of `count` idle GPUs of `model` (no uuid: the agent derives it from the node).

    With `mig`, the first `mig.gpus` of them are in MIG mode with one MIG device per profile.
    """
    if count < 1:
        raise ValueError(f"count={count}: must be >= 1")
    name = catalog.lookup(model).name
    mig = mig or MigLayout()
    if rule := mig.error(name, count):
        raise ValueError(f"mig={','.join(mig.profiles)}: {rule}")
    partitioned = {"enabled": True, "devices": [{"profile": p} for p in mig.profiles]}
    return {"gpus": [{"model": name, **({"mig": partitioned} if i < mig.gpus else {})} for i in range(count)]}


def is_idle_set(doc: Any, model: str, count: int) -> bool:
    """True for a sim file with exactly `count` GPUs of `model` (any alias), no processes, load or faults."""
    if not isinstance(doc, dict) or not set(doc) <= {"gpus", "driver_version", "_comment"}:
        return False
    gpus = doc.get("gpus")
    if not isinstance(gpus, list) or len(gpus) != count:
        return False
    want = catalog.lookup(model).name
    for gpu in gpus:
        if not isinstance(gpu, dict) or not set(gpu) <= {"model", "base_used_mib"}:
            return False
        if gpu.get("base_used_mib", 0) != 0:
            return False
        try:
            if catalog.lookup(str(gpu.get("model", ""))).name != want:
                return False
        except KeyError:
            return False
    return True


def sim_file_for(
    model: str, count: int, samples: Iterable[Path], out_dir: Path, mig: MigLayout | None = None
) -> Path:
    """A sample file of exactly this idle shape, else one written to `out_dir` (rewritten each time)."""
    name = catalog.lookup(model).name
    if mig is not None and mig.profiles:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{name}x{count}-mig{mig.gpus}-{'_'.join(mig.profiles)}.yaml"
        header = (
            f"# Generated by `make dev` with --mig: {count} idle {name}, the first {mig.gpus} in MIG mode.\n"
        )
        path.write_text(header + yaml.safe_dump(sim_document(name, count, mig), sort_keys=False))
        return path
    for path in sorted(samples):
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if is_idle_set(doc, model, count):
            return path
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}x{count}.yaml"
    header = f"# Generated by `make dev`: {count} idle {name}; UUIDs derive from the node name.\n"
    path.write_text(header + yaml.safe_dump(sim_document(name, count), sort_keys=False))
    return path


@dataclass(frozen=True)
class NodeShape:
    model: str
    gpus: int
    mig: MigLayout = field(default_factory=MigLayout)


def node_shape(node: Mapping[str, Any]) -> NodeShape:
    """Model and GPU count of a (fake) node as created: its gpu-model label and gpu-milli capacity / 1000."""
    labels = node["metadata"].get("labels") or {}
    capacity = (node.get("status") or {}).get("capacity") or {}
    model = labels.get(names.NODE_LABEL_GPU_MODEL)
    milli = capacity.get(names.RESOURCE_GPU_MILLI)
    if not model or milli is None:
        raise ValueError(
            f"node {node['metadata'].get('name')!r} has no {names.NODE_LABEL_GPU_MODEL} label or "
            f"{names.RESOURCE_GPU_MILLI} capacity: not a gpupack dev node"
        )
    mig = MigLayout.of(node["metadata"].get("annotations") or {})
    return NodeShape(catalog.lookup(model).name, _milli_to_gpus(str(milli)), mig)


def _milli_to_gpus(raw: str) -> int:
    # The apiserver stores quantities canonically: 2000 comes back as "2k".
    value = int(raw[:-1]) * 1000 if raw.endswith("k") else int(raw)
    if value < 1000 or value % 1000:
        raise ValueError(f"{names.RESOURCE_GPU_MILLI}={raw!r}: not a whole number of GPUs")
    return value // 1000


def agent_spec(
    node: str,
    *,
    sim: Path,
    port: int,
    kubeconfig: Path,
    state_dir: Path,
    heartbeat: str = "30s",
    node_side: Sequence[str] = (),
) -> ComponentSpec:
    """`node_side`: the MPS and node-side flags of a node that runs them (nodeside.NodeSide.agent_flags);
    empty for a kwok node, which runs no containers and no MPS daemon."""
    # Simulated GPUs have no MPS daemon to run; the default /tmp pipe dir would be shared by every agent
    # (and by a real one on this host), so point them into the cluster dir anyway.
    mps = tuple(node_side) or ("--no-mps", "--mps-pipe-dir", str(state_dir / "mps" / node))
    argv = gpupack_cli(
        "agent", "run",
        "--node", node,
        "--kubeconfig", str(kubeconfig),
        "--sim", str(sim),
        "--heartbeat", heartbeat,
        "--host", "127.0.0.1", "--port", str(port),
        *mps,
    )  # fmt: skip
    return ComponentSpec(
        name=f"{AGENT_PREFIX}{node}",
        argv=argv,
        health=HealthCheck(f"http://127.0.0.1:{port}/healthz"),
        env={"NODE_NAME": node},
        ready_timeout_s=90,
    )


def extender_spec(
    port: int, ops_port: int, kubeconfig: Path, tls: tuple[Path, Path, Path], extra: Sequence[str] = ()
) -> ComponentSpec:
    """The extender: kube-scheduler's verbs on `port` (mutual TLS: `tls` = cert, key, client CA), its
    probes and metrics on `ops_port` (plain HTTP); `extra` flags (e.g. --policy) are appended."""
    cert, key, client_ca = tls
    argv = gpupack_cli(
        "extender", "serve",
        "--kubeconfig", str(kubeconfig),
        "--host", "127.0.0.1", "--port", str(port), "--ops-port", str(ops_port),
        "--tls-cert", str(cert), "--tls-key", str(key), "--client-ca", str(client_ca),
        "--lease-namespace", GPUPACK_NAMESPACE, "--lease-name", EXTENDER,
        "--identity", "gpupack-dev",
        *extra,
    )  # fmt: skip
    return ComponentSpec(
        name=EXTENDER,
        argv=argv,
        # /readyz, not /healthz: only the leader with synced informers serves the scheduler correctly,
        # so that is what `dev up` waits for and what `dev status` reports.
        health=HealthCheck(f"http://127.0.0.1:{ops_port}/readyz"),
        ready_timeout_s=90,
    )


def webhook_spec(
    port: int,
    cert: Path,
    key: Path,
    ca_file: Path,
    kubeconfig: Path,
    *,
    mps_pipe_host_dir: Path | None = None,
    runtime_class: str | None = None,
) -> ComponentSpec:
    """`runtime_class`: gpupack's RuntimeClass, set on MPS pods as the chart's webhook does (None: the legacy
    hostPath of the pipe dir in the pod). `mps_pipe_host_dir`: that hostPath (default /tmp/nvidia-mps); a
    real kubelet creates it, so a dev cluster with a real node keeps it inside the cluster dir. The webhook
    reads the GPUNodes as the chart's does (`--read-gpunodes`): quota charges come from the dev cluster's
    GPUs."""
    pipe = ("--mps-pipe-host-dir", str(mps_pipe_host_dir)) if mps_pipe_host_dir is not None else ()
    node_side = ("--runtime-class", runtime_class) if runtime_class is not None else ()
    argv = gpupack_cli(
        "webhook", "serve",
        "--cert", str(cert), "--key", str(key),
        "--host", "127.0.0.1", "--port", str(port),
        "--read-gpunodes", "--kubeconfig", str(kubeconfig),
        *pipe, *node_side,
    )  # fmt: skip
    return ComponentSpec(
        name=WEBHOOK,
        argv=argv,
        health=HealthCheck(f"https://127.0.0.1:{port}/readyz", ca_file=str(ca_file)),
        ready_timeout_s=60,
    )


def probe_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpupack-webhook-probe", "annotations": {names.GPU_FRACTION: "0.5"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


# ---- API helpers ----
# Each takes a `kubernetes` ApiClient (what `Cluster.api_client()` gives) and sends plain
# `app.kube.calls` requests through `app.kube.client.Kube`, the one module that talks to the API.


def create(api: Any, obj: Mapping[str, Any]) -> JsonDict | None:
    """Create `obj`; None when it exists already (an addon re-run against the same apiserver is harmless)."""
    try:
        return Kube(api).send(calls.create(obj))
    except KubeError as exc:
        if not exc.is_conflict:
            raise
        return None


def install_crd(api: Any, crd: Mapping[str, Any], timeout_s: float = 30) -> None:
    kube = Kube(api)
    create(api, crd)
    name = crd["metadata"]["name"]

    def established() -> bool:
        conditions = (kube.send(Request("GET", paths.crd(name))).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    wait_for(established, timeout_s, f"CRD {name} Established", interval=0.1)


def install_rbac(api: Any, objects: Iterable[Mapping[str, Any]]) -> None:
    _install(api, objects, RBAC_KINDS, "an RBAC kind")


def install_policies(api: Any, objects: Iterable[Mapping[str, Any]]) -> None:
    _install(api, objects, POLICY_KINDS, "a policy kind")


def _install(api: Any, objects: Iterable[Mapping[str, Any]], kinds: Sequence[str], what: str) -> None:
    for obj in objects:
        if obj["kind"] not in kinds:
            raise ValueError(f"not {what}: {obj['kind']}")
        create(api, {"apiVersion": _API_VERSIONS[obj["kind"]], **obj})


def wait_for_pod_policy(api: Any, namespace: str, timeout_s: float = 30) -> None:
    """Until the apiserver enforces the pod-allocation policy in `namespace` (it loads policies async)."""
    kube = Kube(api)

    def denied() -> bool:
        try:
            kube.send(calls.create(allocation_probe_pod(), namespace, dry_run=True))
        except KubeError as exc:
            return exc.code in (403, 422) and names.ALLOC_NODE in exc.message
        return False

    wait_for(denied, timeout_s, f"the pod-allocation admission policy in effect in {namespace}", interval=0.1)


def agent_node_token(api: Any, node: str, expiration_s: int = AGENT_TOKEN_SECONDS) -> str:
    """A gpupack-agent ServiceAccount token bound to a stand-in agent pod on `node` (created if missing).

    It authenticates as system:serviceaccount:gpupack-system:gpupack-agent, like the static dev token,
    plus the extra `authentication.kubernetes.io/node-name: <node>`: the identity a real DaemonSet pod gets.
    """
    kube = Kube(api)
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": AGENT_SERVICE_ACCOUNT, "namespace": GPUPACK_NAMESPACE},
    }
    create(api, sa)
    body = agent_anchor_pod(node)
    name = body["metadata"]["name"]
    pod = create(api, body) or kube.send(Request("GET", paths.pod(GPUPACK_NAMESPACE, name)))
    request = bound_token_request(name, pod["metadata"]["uid"], expiration_s)
    token_path = paths.service_account_token(GPUPACK_NAMESPACE, AGENT_SERVICE_ACCOUNT)
    answer = kube.send(Request("POST", token_path, request))
    return str(answer["status"]["token"])


# ---- the addons ----


class DevAddon(Protocol):
    name: str

    def start(self, cluster: Cluster, nodes: Sequence[str], progress: Progress = _quiet) -> None:
        """Start the addon's processes against `cluster`; raise to abort `dev up` (which then stops all)."""


class Definitions:
    """The GPUNode CRD, the components' RBAC and admission policies, before any component starts."""

    name = "crd+rbac+policies"

    def start(self, cluster: Cluster, nodes: Sequence[str], progress: Progress = _quiet) -> None:
        crd = yaml.safe_load(source_file(CRD_RELPATH).read_text())
        docs = list(yaml.safe_load_all(source_file(MANIFEST_RELPATH).read_text()))
        objects = rbac_objects(docs)
        missing = {c for c in ("extender", "agent") if not any(_component(o) == c for o in objects)}
        if missing:  # the chart moved its RBAC: fail here, not as a 403 deep in a component's log
            raise RuntimeError(f"{MANIFEST_RELPATH} holds no RBAC for {', '.join(sorted(missing))}")
        policies = policy_objects(docs)
        if not policies:
            raise RuntimeError(f"{MANIFEST_RELPATH} holds no ValidatingAdmissionPolicy")
        node_side = runtime_class(docs)
        if node_side is None:
            raise RuntimeError(f"{MANIFEST_RELPATH} holds no RuntimeClass (the chart's nodeSide)")
        with cluster.api_client() as api:
            install_crd(api, crd)
            install_rbac(api, objects)
            install_policies(api, policies)
            create(api, node_side)
            wait_for_pod_policy(api, PROBE_NAMESPACE)


def _component(obj: Mapping[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(COMPONENT_LABEL, ""))


class Components:
    """The extender, the webhook and one agent per node, launched together, then wired in.

    Together because each is a Python start-up of one to two seconds that does not depend on the others:
    one overlapping wait instead of one after another. The webhook is registered only once it answers
    (failurePolicy Fail would otherwise refuse GPU pods meanwhile); `dev up` returns once the webhook
    mutates and every node's GPUNode is published, so the first pod a user creates is placed.
    """

    name = "extender+webhook+agents"

    def __init__(
        self,
        *,
        agent_heartbeat: str = "30s",
        probe_timeout_s: float = 30,
        mps_pipe_host_dir: Path | None = None,
        extender_extra: Sequence[str] = (),
        node_side: bool = True,
        node_side_agents: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.extender_extra = tuple(extender_extra)  # more `extender serve` flags (e.g. --autoscale-pool)
        self.agent_heartbeat = agent_heartbeat
        self.probe_timeout_s = probe_timeout_s
        self.mps_pipe_host_dir = mps_pipe_host_dir
        # As the chart's default: the webhook sets gpupack's RuntimeClass on MPS pods (the Definitions addon
        # created it). False: the legacy hostPath, for nodes whose containerd lacks the handler.
        self.node_side = node_side
        # The agent flags of nodes that run the node side (a real node, nodeside.RealNodeSide): by node name.
        self.node_side_agents = dict(node_side_agents or {})

    def start(self, cluster: Cluster, nodes: Sequence[str], progress: Progress = _quiet) -> None:
        specs = [
            extender_spec(
                cluster.extender_port,
                cluster.extender_ops_port,
                cluster.kubeconfig_for(EXTENDER),
                cluster.extender_tls,
                self.extender_extra,
            ),
            webhook_spec(
                cluster.webhook_port,
                cluster.webhook_cert_file,
                cluster.webhook_key_file,
                cluster.ca_file,
                cluster.kubeconfig_for(WEBHOOK),
                mps_pipe_host_dir=self.mps_pipe_host_dir,
                runtime_class=self.runtime_class_name() if self.node_side else None,
            ),
            *self.agent_specs(cluster, nodes),
        ]
        cluster.start_processes(specs, progress)
        progress("registering the webhook")
        self.register_webhook(cluster)
        with cluster.api_client() as api:
            wait_for_gpunodes(api, nodes, timeout_s=30)

    @staticmethod
    def runtime_class_name() -> str:
        """The chart's RuntimeClass name (nodeSide.runtimeClassName), as the Definitions addon created it."""
        node_side = runtime_class(yaml.safe_load_all(source_file(MANIFEST_RELPATH).read_text()))
        if node_side is None:
            raise RuntimeError(f"{MANIFEST_RELPATH} holds no RuntimeClass (the chart's nodeSide)")
        return str(node_side["metadata"]["name"])

    def agent_specs(self, cluster: Cluster, nodes: Sequence[str]) -> list[ComponentSpec]:
        if not nodes:
            return []
        with cluster.api_client() as api:
            kubeconfigs = {n: self.agent_kubeconfig(cluster, api, n) for n in nodes}
        sims = node_sims(cluster, nodes)
        return [
            agent_spec(
                n,
                sim=sims[n],
                port=port,
                kubeconfig=kubeconfigs[n],
                state_dir=cluster.dir,
                heartbeat=self.agent_heartbeat,
                node_side=self.node_side_agents.get(n, ()),
            )
            for n, port in zip(nodes, free_ports(len(nodes)), strict=True)
        ]

    @staticmethod
    def agent_kubeconfig(cluster: Cluster, api: Any, node: str) -> Path:
        """DIR/agents/<node>.kubeconfig with a token bound to that node (see agent_node_token)."""
        user = f"system:serviceaccount:{GPUPACK_NAMESPACE}:{AGENT_SERVICE_ACCOUNT}"
        doc = kubeconfig(cluster.api_url, str(cluster.ca_file), user, agent_node_token(api, node))
        path = cluster.dir / "agents" / f"{node}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def register_webhook(self, cluster: Cluster) -> None:
        """Create the MutatingWebhookConfiguration; wait until a dry-run pod create comes back mutated."""
        template = yaml.safe_load(source_file(WEBHOOK_CONFIG_RELPATH).read_text())
        url = f"https://127.0.0.1:{cluster.webhook_port}/mutate"
        body = webhook_configuration(template, cluster.ca_bundle, url)
        last = ["no probe yet"]
        with cluster.api_client() as api:
            create(api, body)
            kube = Kube(api)

            def in_effect() -> bool:
                try:
                    pod = kube.send(calls.create(probe_pod(), PROBE_NAMESPACE, dry_run=True))
                except KubeError as exc:  # e.g. TLS trouble: keep trying, report it on timeout
                    last[0] = f"{exc.code} {exc.reason}: {exc.message[:200]}"
                    return False
                last[0] = "pod admitted without the mutation"
                return (pod.get("metadata", {}).get("labels") or {}).get(names.LABEL_MANAGED) == "true"

            try:
                wait_for(in_effect, self.probe_timeout_s, "webhook mutating a dry-run pod", interval=0.1)
            except WaitTimeoutError:
                raise WaitTimeoutError(
                    f"the apiserver did not apply the gpupack webhook within {self.probe_timeout_s:.0f}s "
                    f"(last: {last[0]}); see {cluster.log_path(WEBHOOK)} and "
                    f"{cluster.log_path('kube-apiserver')}"
                ) from None


def node_sims(cluster: Cluster, nodes: Sequence[str]) -> dict[str, Path]:
    """Each node's simulated GPU set, from its shape as created (one file per shape, see sim_file_for)."""
    root = repo_root()
    samples = list((root / SIM_SAMPLES_RELPATH).glob("*.yaml")) if root is not None else []
    with cluster.api_client() as api:
        kube = Kube(api)
        shapes = {n: node_shape(kube.send(Request("GET", paths.node(n)))) for n in nodes}
    sims = {
        s: sim_file_for(s.model, s.gpus, samples, cluster.dir / "sim", s.mig) for s in set(shapes.values())
    }
    return {n: sims[shapes[n]] for n in nodes}


class RealNodeSide:
    """The chart's node side on the real node (nodeside.py): handler built and installed, MPS prepared and its
    (stand-in) daemon running, before the components start; the real node's agent then gets
    `side.agent_flags()` (pass them to Components' node_side_agents)."""

    name = "node-side"

    def __init__(self, side: NodeSide, timeout_s: float = 30) -> None:
        self.side = side
        self.timeout_s = timeout_s

    def start(self, cluster: Cluster, nodes: Sequence[str], progress: Progress = _quiet) -> None:
        side = self.side
        root = repo_root()
        if root is None:
            raise FileNotFoundError("the dev cluster's --real-node runs the node side from a source checkout")
        progress("building the runtime handler (handler/build.sh)")
        handler = build_handler(root)
        prepare(side, node_sims(cluster, [side.node])[side.node])
        cluster.start_process(side.mps_daemon_spec(), progress)
        wait_for(side.control.exists, self.timeout_s, f"the MPS daemon's control socket {side.control}")
        cluster.start_process(side.installer_spec(handler, cluster.kubeconfig), progress)
        installed = side.handler_dir / handler.name
        wait_for(installed.exists, self.timeout_s, f"the runtime handler installed at {installed}")


def wait_for_gpunodes(api: Any, nodes: Sequence[str], timeout_s: float) -> None:
    """Until every node's GPUNode has a status (the extender places nothing on a node without one)."""
    kube = Kube(api)
    left: set[str] = set(nodes)

    def done() -> bool:
        listed = kube.send(calls.list_request(paths.gpunodes())).get("items") or []
        reported = {o["metadata"]["name"] for o in listed if o.get("status")}
        left.clear()
        left.update(set(nodes) - reported)
        return not left

    try:
        wait_for(done, timeout_s, "GPUNodes reported")
    except WaitTimeoutError:
        raise WaitTimeoutError(f"no GPUNode status within {timeout_s:.0f}s for {sorted(left)}") from None


# Started by `make dev` in this order (after the control plane and the nodes).
DEV_ADDONS: tuple[DevAddon, ...] = (Definitions(), Components())
