"""`make dev` end to end: the harness command starts a cluster with our extender, webhook and agents.

Everything a user would touch goes through real processes: the webhook mutates the pod the apiserver
stores, kube-scheduler asks our extender, the extender writes the allocation and binds, kwok runs the pod,
the agents publish GPUNodes. Nothing here uses the session `cluster` fixture: `dev up` builds its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity
from prometheus_client.parser import text_string_to_metric_families

from app.core import catalog, names
from app.kube.gpunode import GPUNode, read
from tests.devcluster import BinariesError, ensure_binaries, wait_for
from tests.devcluster.components import CONTROL_PLANE
from tests.devcluster.processes import group_members, log_tail, pid_alive

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"
NODES = ["gpu-node-0", "gpu-node-1"]
MODEL = "A100-40GB"  # `make dev`'s default
COMPONENTS = ["gpupack-extender", "gpupack-webhook", *(f"gpupack-agent-{n}" for n in NODES)]
HOOK = "pods.webhook.gpupack.io"
ENV_REFS = {
    "NVIDIA_VISIBLE_DEVICES": names.ALLOC_GPU_UUIDS,
    "CUDA_VISIBLE_DEVICES": names.ALLOC_GPU_UUIDS,
    "GPUPACK_MEMORY_LIMIT_MIB": names.ALLOC_MEMORY_LIMIT_MIB,
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": names.ALLOC_THREAD_PERCENTAGE,
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": names.ALLOC_MPS_MEMORY_LIMIT,
}


Run = Callable[..., subprocess.CompletedProcess[str]]


@dataclass
class Dev:
    dir: Path
    env: dict[str, str]
    up: subprocess.CompletedProcess[str]
    up_seconds: float

    @property
    def state(self) -> dict[str, Any]:
        raw: dict[str, Any] = json.loads((self.dir / "state.json").read_text())
        return raw

    def logs(self, lines: int = 30) -> str:
        paths = sorted((self.dir / "logs").glob("*.log"))
        return "\n".join(f"---- {p.name}\n{log_tail(p, lines)}" for p in paths)

    @contextmanager
    def explained(self) -> Iterator[None]:
        """On failure, print the tail of every component log (pytest shows it with the failure)."""
        try:
            yield
        except BaseException:
            print(f"`dev up` stderr:\n{self.up.stderr}\n\ncomponent logs (tail):\n{self.logs()}")
            raise


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory, run_devcluster: Run) -> Iterator[Dev]:
    try:
        bins = ensure_binaries()
    except BinariesError as exc:
        pytest.fail(f"needs Kubernetes binaries and they cannot be built:\n{exc}", pytrace=False)
    d = tmp_path_factory.mktemp("dev-e2e") / "dev"
    env = {**os.environ, "GPUPACK_K8S_BIN": str(bins)}
    t0 = time.monotonic()
    up = run_devcluster(
        "up", "--dir", str(d), "--nodes", "2", "--gpus-per-node", "2", "--gpu-model", MODEL, env=env
    )  # fmt: skip
    seconds = time.monotonic() - t0
    handle = Dev(d, env, up, seconds)
    try:
        if up.returncode != 0:
            pytest.fail(f"dev up failed ({up.returncode}):\n{up.stderr}\n{handle.logs()}", pytrace=False)
        print(f"python -m tests.devcluster up (2 nodes x 2 {MODEL}, with components): {seconds:.1f}s")
        yield handle
    finally:
        # Whatever a test did, never leave a cluster behind (a no-op once test_down has run).
        run_devcluster("down", "--dir", str(d), env=env, timeout=120)


@pytest.fixture(scope="module")
def api(dev: Dev) -> Iterator[Any]:
    with config.new_client_from_config(config_file=str(dev.dir / "kubeconfig")) as c:
        yield c


@pytest.fixture(scope="module")
def core(api: Any) -> Any:
    return client.CoreV1Api(api)


def gpunode(api: Any, name: str) -> GPUNode:
    raw = client.CustomObjectsApi(api).get_cluster_custom_object(
        names.GPUNODE_GROUP, names.GPUNODE_VERSION, names.GPUNODE_PLURAL, name
    )
    return read(raw)


def example(name: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return body


def bound(core: Any, namespace: str, name: str, timeout: float = 60) -> Any:
    """The pod once it is bound to a node and carries the allocation; fails with its conditions if not."""
    last: list[Any] = [None]

    def check() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        last[0] = pod.status.conditions
        annotations = pod.metadata.annotations or {}
        return pod if pod.spec.node_name and names.ALLOC_NODE in annotations else None

    try:
        return wait_for(check, timeout, f"pod {namespace}/{name} bound with an allocation")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; pod conditions: {last[0]}") from None


def running(core: Any, namespace: str, name: str, timeout: float = 60) -> Any:
    def check() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase == "Running" else None

    return wait_for(check, timeout, f"pod {namespace}/{name} Running")


def extender_binds(dev: Dev) -> float:
    port = dev.state["ports"]["extender_ops"]  # the plain-HTTP port of /metrics and the probes
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never proxy loopback
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "gpupack_extender_binds":
            return sum(
                s.value
                for s in family.samples
                if s.name.endswith("_total") and s.labels["outcome"] == "bound"
            )
    return 0.0


def test_up_starts_and_records_every_component(dev: Dev, run_devcluster: Run) -> None:
    with dev.explained():
        kubeconfig = dev.dir / "kubeconfig"
        out = dev.up.stdout
        assert f"kubeconfig: {kubeconfig}" in out
        assert f"kubectl --kubeconfig {kubeconfig} get gpunodes" in out
        assert f"kubectl --kubeconfig {kubeconfig} create -f {EXAMPLES / 'fraction-pod.yaml'}" in out
        procs = dev.state["processes"]
        assert [p["name"] for p in procs] == [*CONTROL_PLANE, *COMPONENTS]
        for p in procs:  # alive after `up` exited, each leading its own session
            assert pid_alive(p["pid"], p["ticks"]), p["name"]
            assert os.getsid(p["pid"]) == p["pid"], p["name"]
        for name in COMPONENTS:
            assert (dev.dir / "logs" / f"{name}.log").is_file(), name

        status = run_devcluster("status", "--dir", str(dev.dir), env=dev.env)
        assert status.returncode == 0, status.stdout + status.stderr
        rows = {line.split()[0]: line for line in status.stdout.splitlines()[1:] if line.strip()}
        for name in [*CONTROL_PLANE, *COMPONENTS]:
            assert " healthy " in rows[name], rows.get(name)


def test_agents_publish_fresh_gpunodes(dev: Dev, api: Any) -> None:
    with dev.explained():
        for node in NODES:
            gn = gpunode(api, node)
            assert [(g.index, g.model) for g in gn.spec.gpus] == [(0, MODEL), (1, MODEL)]
            assert gn.status is not None
            now = time.time()
            assert now - gn.status.heartbeat_time < gn.status.stale_after_seconds, node
        # Simulated UUIDs derive from the node name: the two nodes never share a GPU identity.
        uuids = [g.uuid for n in NODES for g in gpunode(api, n).spec.gpus]
        assert len(set(uuids)) == 4


def test_fractional_pods_are_mutated_packed_bound_and_run(dev: Dev, api: Any, core: Any) -> None:
    with dev.explained():
        ns = "e2e"
        core.create_namespace({"metadata": {"name": ns}})
        body = example("fraction-pod.yaml")
        main = body["spec"]["containers"][0]
        assert body["metadata"]["annotations"] == {names.GPU_FRACTION: "0.5"}
        assert "resources" not in main and "env" not in main  # the webhook must add them
        binds_before = extender_binds(dev)

        first = core.create_namespaced_pod(ns, body)
        name = first.metadata.name
        # What the apiserver stored is already mutated by our webhook.
        assert (first.metadata.labels or {}).get(names.LABEL_MANAGED) == "true"
        container = first.spec.containers[0]
        for part in (container.resources.requests, container.resources.limits):
            assert parse_quantity(part[names.RESOURCE_GPU_MILLI]) == 500
        refs = {e.name: e.value_from.field_ref.field_path for e in container.env if e.value_from}
        assert refs == {k: f"metadata.annotations['{v}']" for k, v in ENV_REFS.items()}

        pod = bound(core, ns, name)
        node = pod.spec.node_name
        alloc = pod.metadata.annotations
        assert alloc[names.ALLOC_NODE] == node
        assert alloc[names.ALLOC_GPU_MILLI] == "500"
        uuid = alloc[names.ALLOC_GPU_UUIDS]
        assert uuid in {g.uuid for g in gpunode(api, node).spec.gpus}

        def scheduled_event() -> Any:
            events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
            return next((e for e in events if e.reason == "Scheduled"), None)

        event = wait_for(scheduled_event, 30, f"Scheduled event of {name}")
        assert (event.reporting_component or event.source.component) == "default-scheduler"
        assert f"to {node}" in event.message
        running(core, ns, name)

        # Bin-packing: the second half goes onto the same GPU, not the idle one next to it.
        second = core.create_namespaced_pod(ns, example("fraction-pod.yaml"))
        pod2 = bound(core, ns, second.metadata.name)
        assert pod2.spec.node_name == node
        assert pod2.metadata.annotations[names.ALLOC_GPU_UUIDS] == uuid
        assert pod2.metadata.annotations[names.ALLOC_GPU_MILLI] == "500"
        running(core, ns, second.metadata.name)
        # Both binds went through our extender (the scheduler's own binder writes no allocation).
        assert extender_binds(dev) - binds_before == 2

        # The memory example is placed too; converted to milli of this GPU model by the extender.
        mem = core.create_namespaced_pod(ns, example("memory-pod.yaml"))
        mem_container = mem.spec.containers[0]
        assert parse_quantity(mem_container.resources.limits[names.RESOURCE_GPU_MEMORY_MIB]) == 4096
        pod3 = bound(core, ns, mem.metadata.name)
        assert pod3.metadata.annotations[names.ALLOC_GPU_UUIDS] != uuid  # that GPU is full
        assert pod3.metadata.annotations[names.ALLOC_MEMORY_LIMIT_MIB] == "4096"
        running(core, ns, mem.metadata.name)

        # A whole GPU: the simulated GPUs report driver memory in use, which is no reservation.
        whole = core.create_namespaced_pod(ns, example("whole-gpu-pod.yaml"))
        pod4 = bound(core, ns, whole.metadata.name)
        taken = {uuid, pod3.metadata.annotations[names.ALLOC_GPU_UUIDS]}
        assert pod4.metadata.annotations[names.ALLOC_GPU_MILLI] == "1000"
        assert pod4.metadata.annotations[names.ALLOC_GPU_UUIDS] not in taken
        running(core, ns, whole.metadata.name)


def test_an_mps_pod_in_a_baseline_namespace_is_admitted_without_a_hostpath(dev: Dev, core: Any) -> None:
    """As after installing the chart (nodeSide on by default): the webhook sets gpupack's RuntimeClass, which
    exists, instead of a hostPath of the MPS pipe dir, so Pod Security `baseline` admits the share."""
    with dev.explained():
        ns = "e2e-baseline"
        labels = {"pod-security.kubernetes.io/enforce": "baseline"}
        core.create_namespace({"metadata": {"name": ns, "labels": labels}})
        created = core.create_namespaced_pod(ns, example("fraction-pod.yaml"))
        assert (created.metadata.labels or {}).get(names.LABEL_MANAGED) == "true"
        assert created.spec.runtime_class_name == "gpupack"
        assert not [v for v in created.spec.volumes or [] if v.host_path is not None]
        env = {e.name: e for e in created.spec.containers[0].env}
        assert env["CUDA_MPS_PIPE_DIRECTORY"].value == names.MPS_PIPE_DIRECTORY
        running(core, ns, bound(core, ns, created.metadata.name).metadata.name)


def test_a_kai_fraction_limit_is_the_hard_cap_on_the_gpu_it_lands_on(dev: Dev, core: Any) -> None:
    """KAI 0.18's gpu-fraction.limit: 0.75 of the GPU's memory is the pod's cap, its request 0.25 of it."""
    with dev.explained():
        body = example("fraction-pod.yaml")
        body["metadata"]["annotations"] = {names.GPU_FRACTION: "0.25", names.KAI_FRACTION_LIMIT: "0.75"}
        created = core.create_namespaced_pod("default", body)
        alloc = bound(core, "default", created.metadata.name).metadata.annotations
        gpu = catalog.lookup(MODEL).memory_mib
        assert alloc[names.ALLOC_MEMORY_LIMIT_MIB] == str(gpu // 4)
        assert alloc[names.ALLOC_MEMORY_HARD_LIMIT_MIB] == str(gpu * 3 // 4)
        core.delete_namespaced_pod(created.metadata.name, "default")


def test_quota_example_admits_two_halves_and_refuses_the_third(dev: Dev, core: Any) -> None:
    """deploy/examples/gpu-quota.yaml as its comment says: one GPU of quota runs two gpu-fraction 0.5 pods;
    the apiserver refuses a third at creation naming the quota. The webhook charges each half 500 milli and
    half of the dev cluster's A100-40GB in memory (20480 MiB), read from the GPUNodes the agents publish."""
    with dev.explained():
        ns = "quota-example"
        core.create_namespace({"metadata": {"name": ns}})
        quota = example("gpu-quota.yaml")
        core.create_namespaced_resource_quota(ns, quota)
        hard = quota["spec"]["hard"]

        def computed() -> bool:
            status = core.read_namespaced_resource_quota(quota["metadata"]["name"], ns).status
            got = {k: parse_quantity(v) for k, v in (status.hard or {}).items()}
            return got == {k: parse_quantity(v) for k, v in hard.items()}

        wait_for(computed, 60, "the quota's status computed")
        admitted = [core.create_namespaced_pod(ns, example("fraction-pod.yaml")) for _ in range(2)]
        for pod in admitted:
            requests = pod.spec.containers[0].resources.requests
            assert parse_quantity(requests[names.RESOURCE_QUOTA_GPU_MILLI]) == 500
            assert parse_quantity(requests[names.RESOURCE_QUOTA_GPU_MEMORY_MIB]) == 20480
            running(core, ns, bound(core, ns, pod.metadata.name).metadata.name)
        with pytest.raises(ApiException) as err:
            core.create_namespaced_pod(ns, example("fraction-pod.yaml"))
        assert err.value.status == 403
        milli, memory = (
            f"requests.{names.RESOURCE_QUOTA_GPU_MILLI}",
            f"requests.{names.RESOURCE_QUOTA_GPU_MEMORY_MIB}",
        )
        message = json.loads(err.value.body)["message"]
        assert message.startswith('pods "fraction-')
        assert message.endswith(
            f"is forbidden: exceeded quota: gpu, requested: {memory}=20480,{milli}=500, "
            f"used: {memory}=40960,{milli}=1k, limited: {memory}=40960,{milli}=1k"
        ), message
        print(f"quota example, third pod: {message}")


def test_invalid_fraction_is_refused_with_the_webhooks_message(dev: Dev, core: Any) -> None:
    with dev.explained():
        body = example("fraction-pod.yaml")
        body["metadata"]["annotations"][names.GPU_FRACTION] = "1.5"
        with pytest.raises(ApiException) as err:
            core.create_namespaced_pod("default", body)
        assert err.value.status == 422
        message = "gpu-fraction='1.5': must be a decimal in (0, 1] with at most 2 decimals"
        assert f'admission webhook \\"{HOOK}\\" denied the request: {message}' in err.value.body


def test_down_leaves_no_process(dev: Dev, run_devcluster: Run) -> None:
    with dev.explained():
        procs = dev.state["processes"]
        assert len(procs) == len(CONTROL_PLANE) + len(COMPONENTS)
        down = run_devcluster("down", "--dir", str(dev.dir), env=dev.env, timeout=120)
        assert down.returncode == 0, down.stderr
        assert f"stopped {len(procs)} processes" in down.stdout
        for p in procs:
            assert not pid_alive(p["pid"], p["ticks"]), p["name"]
            assert group_members(p["pid"]) == [], p["name"]
        assert not (dev.dir / "state.json").exists()
        status = run_devcluster("status", "--dir", str(dev.dir), env=dev.env)
        assert status.returncode == 1
