"""The extender behind a TCP proxy to the real apiserver: it survives the API being cut off, is not Ready
meanwhile, and afterwards is Ready again with a view that includes what changed while it was cut off."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_extender import (
    LEASE_NS,
    MODEL,
    PROC,
    allocations,
    assert_no_overcommit,
    create_gpunodes,
    extender_rbac,
    gpu_pod,
    scheduler_extender_url,
)

from app.core import catalog
from app.kube.client import Kube
from tests.devcluster import Cluster, ComponentSpec, HealthCheck, wait_for
from tests.devcluster.addons import install_rbac


class Proxy:
    """Forwards 127.0.0.1:<port> to `target`; `cut()` drops every connection and refuses new ones
    (they are accepted and closed at once, like a load balancer without a backend) until `restore()`;
    `freeze()` keeps every connection open but forwards nothing (a silent network partition)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.up = True
        self.thawed = threading.Event()
        self.thawed.set()
        self.closing = False
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            t = threading.Thread(target=self._pump, args=(client, upstream), daemon=True)
            self.threads.append(t)
            t.start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self.closing:
                if not self.thawed.is_set():  # frozen: hold the bytes, forward nothing
                    self.thawed.wait(0.2)
                    continue
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()

    def cut(self) -> None:
        self.up = False
        with self.lock:
            for s in self.conns:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.conns.clear()

    def restore(self) -> None:
        self.up = True
        self.thawed.set()

    def freeze(self) -> None:
        self.thawed.clear()

    def close(self) -> None:
        self.closing = True
        self.thawed.set()
        self.cut()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for t in self.threads:
            t.join(timeout=5)


@pytest.fixture(scope="module")
def api(cluster: Cluster, kube: Any, gpunode_crd: None) -> Kube:
    """The extender's RBAC, as in test_extender.py; returns an admin client."""
    install_rbac(kube, extender_rbac())
    return Kube.connect(str(cluster.kubeconfig))


@pytest.fixture
def proxy(cluster: Cluster) -> Iterator[Proxy]:
    host, port = cluster.api_url.removeprefix("https://").rsplit(":", 1)
    p = Proxy((host, int(port)))
    yield p
    p.close()


def kubeconfig_via(cluster: Cluster, proxy: Proxy, path: Path) -> Path:
    conf = yaml.safe_load(cluster.kubeconfig_for("gpupack-extender").read_text())
    for c in conf["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path.write_text(yaml.safe_dump(conf))
    return path


def get(url: str, opener: urllib.request.OpenerDirector | None = None) -> tuple[int, dict[str, Any]]:
    """GET, plain HTTP (the ops port) unless an opener for the mutual-TLS port is given."""
    opener = opener or urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def post(opener: urllib.request.OpenerDirector, url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with opener.open(req, timeout=30) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


@pytest.fixture
def resilient_extender(
    cluster: Cluster,
    api: Kube,
    proxy: Proxy,
    tmp_path: Path,
) -> Iterator[Callable[[], str]]:
    def start() -> str:
        url = scheduler_extender_url(cluster)
        argv = (
            sys.executable, "-m", "app.cli", "extender", "serve",
            "--kubeconfig", str(kubeconfig_via(cluster, proxy, tmp_path / "kubeconfig")),
            "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1], *cluster.extender_tls_flags(),
            "--policy", "binpack",
            "--lease-namespace", LEASE_NS, "--lease-duration", "3",
            "--watch-timeout", "4", "--live-within", "8",
            "--heartbeat-timeout", "86400",
        )  # fmt: skip
        health = HealthCheck(f"http://127.0.0.1:{cluster.extender_ops_port}/readyz")
        spec = ComponentSpec(PROC, argv, health=health, ready_timeout_s=90)
        cluster.start_process(spec)
        return url

    yield start
    if any(p.name == PROC for p in cluster.processes):
        cluster.stop_process(PROC)


@dataclass(frozen=True)
class Scene:
    url: str  # kube-scheduler's endpoints and /explain: mutual TLS
    ops: str  # /readyz, /healthz: plain HTTP
    node: str
    tls: urllib.request.OpenerDirector
    uids: dict[str, str]
    namespace: str

    def bind(self, name: str) -> str:
        """POST /bind as kube-scheduler would, with the scheduler's client certificate."""
        args = {"PodName": name, "PodNamespace": self.namespace, "PodUID": self.uids[name], "Node": self.node}
        return str(post(self.tls, f"{self.url}/bind", args)["Error"])

    def bound_in_view(self, name: str) -> bool:
        """The extender's view shows the pod bound (the watch echo, which ends its hold)."""
        return get(f"{self.url}/explain?pod={self.namespace}/{name}", self.tls)[1].get("boundTo") == self.node

    def ready(self) -> tuple[int, str]:
        code, body = get(f"{self.ops}/readyz")
        return code, str(body.get("reason", ""))


def scene(
    cluster: Cluster, api: Kube, core: Any, namespace: str, *, gpu_nodes: Any, start: Callable[[], str]
) -> Scene:
    """One node with one GPU, pods a and b (0.6 each, not picked up by any scheduler: the test plays
    kube-scheduler and calls /bind itself), the extender."""
    (node,) = gpu_nodes(1, gpus_per_node=1, model=MODEL, labels={"gpupack.test/pool": namespace})
    create_gpunodes(api, [node], 1)
    url = start()
    uids = {}
    for name in ("a", "b"):
        body = gpu_pod(name, namespace, namespace, milli=600, scheduler="none")
        uids[name] = core.create_namespaced_pod(namespace, body).metadata.uid
    ops = f"http://127.0.0.1:{cluster.extender_ops_port}"
    return Scene(url, ops, node, cluster.extender_opener(), uids, namespace)


def test_survives_the_apiserver_being_unreachable_and_binds_correctly_afterwards(  # noqa: PLR0917
    cluster: Cluster,
    resilient_extender: Callable[[], str],
    api: Kube,
    proxy: Proxy,
    core: Any,
    namespace: str,
    gpu_nodes: Any,
) -> None:
    sc = scene(cluster, api, core, namespace, gpu_nodes=gpu_nodes, start=resilient_extender)
    assert sc.bind("a") == ""
    # The watch echo of a's Binding ends its hold: from here on only the view knows a's share.
    wait_for(lambda: sc.bound_in_view("a"), 10, "a's Binding echoed by the watch")
    assert sc.bind("b") == f"{sc.node}: no GPU with 0.60 free: best has 0.40"

    proxy.cut()
    wait_for(lambda: sc.ready()[0] == 503, 30, "extender not ready while the API is cut off")
    assert sc.bind("b").startswith("gpupack extender not ready")
    # While it is cut off, a's pod goes away: only a live view after the outage frees its share.
    core.delete_namespaced_pod("a", namespace, grace_period_seconds=0)
    wait_for(lambda: "a" not in allocations(core, namespace), 30, "pod a deleted")
    wait_for(lambda: "informer not live" in sc.ready()[1], 30, "the view reported stale")
    assert get(f"{sc.ops}/healthz") == (200, {"status": "ok"})  # every worker thread still runs
    assert cluster.process(PROC).alive()

    proxy.restore()
    wait_for(lambda: sc.ready()[0] == 200, 60, "extender ready again after the outage")
    assert get(f"{sc.ops}/healthz")[0] == 200
    assert sc.bind("b") == ""
    allocs = allocations(core, namespace)
    assert allocs["b"][0] == sc.node
    assert allocs["b"][1] is not None and allocs["b"][1].gpu_indexes == (0,)
    assert_no_overcommit(allocs, catalog.lookup(MODEL).memory_mib)


def test_a_frozen_connection_is_detected_and_the_extender_recovers(  # noqa: PLR0917
    cluster: Cluster,
    resilient_extender: Callable[[], str],
    api: Kube,
    proxy: Proxy,
    core: Any,
    namespace: str,
    gpu_nodes: Any,
) -> None:
    sc = scene(cluster, api, core, namespace, gpu_nodes=gpu_nodes, start=resilient_extender)
    proxy.freeze()  # connections stay open, nothing arrives: only timeouts can notice
    wait_for(lambda: sc.ready()[0] == 503, 30, "extender not ready while the network is frozen")

    # Silent watches stop proving the view live (--live-within 8), then their read timeout
    # (timeoutSeconds 4 + 5 s) ends them, which the reason reports as the last error.
    def frozen_watch_timed_out() -> bool:
        reason = sc.ready()[1]
        return "informer not live" in reason and "(last error: 0 Timeout: " in reason

    wait_for(frozen_watch_timed_out, 40, "frozen watches ended by their read timeout")
    assert sc.bind("a").startswith("gpupack extender not ready")
    assert get(f"{sc.ops}/healthz") == (200, {"status": "ok"})
    proxy.restore()
    wait_for(lambda: sc.ready()[0] == 200, 90, "extender ready again after the freeze")
    assert sc.bind("a") == ""
    wait_for(lambda: sc.bound_in_view("a"), 10, "a's Binding echoed by the watch")
    assert sc.bind("b") == f"{sc.node}: no GPU with 0.60 free: best has 0.40"
    assert cluster.process(PROC).alive()
