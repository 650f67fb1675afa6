"""Faults on purpose: a TCP proxy that can be severed or frozen, Service-like routing, and the share audit.

The proxy sits between one of our processes and what it talks to (the extender and the apiserver, the
scheduler and the extender replicas). `audit` reads pods as the API returns them and counts every way a
GPU share could be handed out twice or forgotten; it is what the fault tests and `bench/chaos.py` assert.
"""

from __future__ import annotations

import contextlib
import functools
import json
import select
import signal
import socket
import struct
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from app.core import log, names
from app.core.model import Allocation
from app.kube import gpunode

from .addons import EXTENDER, gpupack_cli
from .cluster import Cluster
from .identities import GPUPACK_NAMESPACE
from .poll import wait_for
from .ports import free_ports
from .processes import ComponentSpec, HealthCheck, ManagedProcess

_log = log.get("gpupack.devcluster.faults")

Upstream = tuple[str, int]
MILLI_PER_GPU = 1000
_CHUNK = 64 * 1024
_TICK_S = 0.1  # how often a pump re-checks freeze/close; bounds how late a freeze or sever takes effect


# ---- the share audit (pure) ----


@dataclass(frozen=True)
class Audit:
    """What the API says about every managed pod, against the promise "never twice, never forgotten"."""

    pods: int  # live managed pods
    bound: int
    pending: int  # live managed pods without a node
    overcommitted: dict[str, int]  # "node/gpu-index" -> milli allocated there, where that exceeds 1000
    unallocated: tuple[str, ...]  # bound managed pods without allocation annotations
    misplaced: tuple[str, ...]  # "ns/pod: allocation on A, bound to B"
    corrupt: tuple[str, ...]  # "ns/pod: why" for allocation annotations that do not parse
    stranded: tuple[str, ...]  # pending pods that already carry an allocation (they hold a share)

    @property
    def ok(self) -> bool:
        """No share counted twice and no bound pod without its share (pending pods are not a failure)."""
        return not (self.overcommitted or self.unallocated or self.misplaced or self.corrupt)

    def to_json(self) -> dict[str, Any]:
        return {
            "pods": self.pods,
            "bound": self.bound,
            "pending": self.pending,
            "overcommitted_gpus": self.overcommitted,
            "bound_without_allocation": list(self.unallocated),
            "allocation_node_mismatch": list(self.misplaced),
            "corrupt_allocations": list(self.corrupt),
            "pending_with_allocation": list(self.stranded),
        }


def _live_managed(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(names.LABEL_MANAGED) != "true":
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def audit(pods: Iterable[Mapping[str, Any]]) -> Audit:
    """Check pods (API JSON, any namespaces): milli per node+GPU <= 1000 over every live allocation.

    A pod with allocation annotations and no node yet still holds its share (DESIGN: "a pod with
    allocation annotations but no Binding yet still holds its share"), so it counts towards the sum.
    """
    milli: dict[str, int] = defaultdict(int)
    counts = {"pods": 0, "bound": 0}
    unallocated: list[str] = []
    misplaced: list[str] = []
    corrupt: list[str] = []
    stranded: list[str] = []
    for pod in pods:
        if not _live_managed(pod):
            continue
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        counts["pods"] += 1
        counts["bound"] += bool(node)
        try:
            alloc = Allocation.from_annotations(meta.get("annotations") or {})
        except ValueError as exc:
            corrupt.append(f"{key}: {exc}")
            continue
        if alloc is None:
            if node:
                unallocated.append(key)
            continue
        if not node:
            stranded.append(key)
        elif alloc.node != node:
            misplaced.append(f"{key}: allocation on {alloc.node}, bound to {node}")
        for index in alloc.gpu_indexes:
            milli[f"{alloc.node}/{index}"] += alloc.milli
    return Audit(
        pods=counts["pods"],
        bound=counts["bound"],
        pending=counts["pods"] - counts["bound"],
        overcommitted={gpu: m for gpu, m in sorted(milli.items()) if m > MILLI_PER_GPU},
        unallocated=tuple(sorted(unallocated)),
        misplaced=tuple(sorted(misplaced)),
        corrupt=tuple(sorted(corrupt)),
        stranded=tuple(sorted(stranded)),
    )


# ---- kubeconfigs that go through a proxy (pure) ----


def kubeconfig_via(doc: Mapping[str, Any], server: str) -> dict[str, Any]:
    """A copy of a kubeconfig whose every cluster points at `server` (same CA, same credentials).

    The apiserver's certificate names the IP 127.0.0.1, not a port, so TLS verifies through a proxy on
    another loopback port unchanged.
    """
    clusters = doc.get("clusters")
    if not isinstance(clusters, list) or not clusters:
        raise ValueError(f"kubeconfig clusters={clusters!r}: must be a non-empty list")
    out = dict(doc)
    out["clusters"] = [{**c, "cluster": {**(c.get("cluster") or {}), "server": server}} for c in clusters]
    return out


# ---- routing like a Service: only ready endpoints get new connections ----


class ReadyPicker:
    """Pick the first upstream whose readiness probe passes, like a Service's ready endpoints.

    Probes are cached for `cache_s`, so a burst of new connections costs one probe round. Returns None
    when no upstream is ready (the proxy then resets the connection, as a Service without endpoints does).
    """

    def __init__(
        self,
        upstreams: Sequence[tuple[Upstream, Callable[[], bool]]],
        *,
        cache_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not upstreams:
            raise ValueError("upstreams=[]: need at least one upstream")
        self._upstreams = list(upstreams)
        self._cache_s = cache_s
        self._clock = clock
        self._lock = threading.Lock()
        self._picked: Upstream | None = None
        self._at: float | None = None

    def __call__(self) -> Upstream | None:
        with self._lock:
            now = self._clock()
            if self._at is None or now - self._at >= self._cache_s:
                self._picked = next((up for up, ready in self._upstreams if _safe(ready)), None)
                self._at = self._clock()
            return self._picked


def _safe(probe: Callable[[], bool]) -> bool:
    try:
        return bool(probe())
    except Exception:  # a probe that raises is a failing probe
        return False


def fixed(host: str, port: int) -> Callable[[], Upstream]:
    """A pick function for a proxy with one upstream."""
    return lambda: (host, port)


# ---- the proxy ----


@dataclass
class ProxyStats:
    accepted: int = 0
    refused: int = 0  # reset at once: severed window, no ready upstream, or upstream unreachable
    severed: int = 0  # open connections cut by sever()
    freezes: int = 0
    history: list[tuple[float, str]] = field(default_factory=list)  # (time.time(), what) per fault


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), as a crashed peer or a cut network looks to the other side."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Pair:
    """One proxied connection: the accepted client socket and our socket to the upstream."""

    def __init__(self, client: socket.socket, upstream: socket.socket, target: Upstream) -> None:
        self.client = client
        self.upstream = upstream
        self.target = target
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._open_halves = 2

    def close(self, *, reset: bool) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
        for s in (self.client, self.upstream):
            if reset:
                _reset(s)
            else:
                s.close()

    def half_done(self) -> bool:
        """One direction finished; True when both have (the pair can go)."""
        with self._lock:
            self._open_halves -= 1
            return self._open_halves == 0


class TcpProxy:
    """A loopback TCP proxy a test can break: `sever` cuts and refuses, `freeze` stops every byte.

    Threads, not asyncio, so it runs beside synchronous test code; one thread per direction of each
    connection (a handful of clients: the extender's watches and requests, the scheduler's calls).
    """

    def __init__(
        self,
        pick: Callable[[], Upstream | None],
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        name: str = "proxy",
    ) -> None:
        self.name = name
        self._pick = pick
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(256)
        self._listener.settimeout(_TICK_S)
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self.stats = ProxyStats()
        self._lock = threading.Lock()
        self._pairs: set[_Pair] = set()
        self._refuse_until = 0.0
        self._flowing = threading.Event()
        self._flowing.set()
        self._closing = threading.Event()
        self._acceptor: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    @property
    def frozen(self) -> bool:
        return not self._flowing.is_set()

    def start(self) -> TcpProxy:
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"{self.name}-accept", daemon=True)
        self._acceptor.start()
        return self

    def close(self) -> None:
        """Stop accepting, cut every connection, and wait for the accept thread."""
        self._closing.set()
        self._flowing.set()
        if self._acceptor is not None:
            self._acceptor.join(timeout=5)
        self._listener.close()
        self._cut_all(reset=False)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- faults ----

    def sever(self, refuse_s: float = 0.0) -> int:
        """Reset every open connection and new ones for `refuse_s` seconds; returns how many were cut."""
        with self._lock:
            self._refuse_until = time.monotonic() + refuse_s
        cut = self._cut_all(reset=True)
        self.stats.severed += cut
        self._note(f"sever {cut} connections, refuse {refuse_s:.1f}s")
        return cut

    def sever_upstream(self, target: Upstream) -> int:
        """Reset the open connections to one upstream (new ones go wherever `pick` says)."""
        with self._lock:
            pairs = [p for p in self._pairs if p.target == target]
            self._pairs.difference_update(pairs)
        for pair in pairs:
            pair.close(reset=True)
        if pairs:
            self._note(f"sever {len(pairs)} connections to {target[0]}:{target[1]}")
        return len(pairs)

    def freeze(self) -> None:
        """Keep every connection open (new ones too) but forward no byte until `thaw`."""
        self._flowing.clear()
        self.stats.freezes += 1
        self._note("freeze")

    def thaw(self) -> None:
        self._flowing.set()
        self._note("thaw")

    def _note(self, what: str) -> None:
        self.stats.history.append((time.time(), what))
        _log.info("proxy fault", extra={"proxy": self.name, "fault": what})

    def _cut_all(self, *, reset: bool) -> int:
        with self._lock:
            pairs = list(self._pairs)
            self._pairs.clear()
        for pair in pairs:
            pair.close(reset=reset)
        return len(pairs)

    # ---- plumbing ----

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            self._admit(client)

    def _admit(self, client: socket.socket) -> None:
        with self._lock:
            refusing = time.monotonic() < self._refuse_until
        target = None if refusing else self._pick()
        if target is None:
            self.stats.refused += 1
            _reset(client)
            return
        try:
            upstream = socket.create_connection(target, timeout=2.0)
        except OSError:
            self.stats.refused += 1
            _reset(client)
            return
        upstream.settimeout(None)
        pair = _Pair(client, upstream, target)
        with self._lock:
            self._pairs.add(pair)
        self.stats.accepted += 1
        for src, dst, way in ((client, upstream, "up"), (upstream, client, "down")):
            threading.Thread(
                target=self._pump, args=(pair, src, dst), name=f"{self.name}-{way}", daemon=True
            ).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        failed = False
        try:
            while not pair.closed.is_set():
                if not self._flowing.wait(_TICK_S):
                    continue
                readable, _, _ = select.select([src], [], [], _TICK_S)
                if not readable or not self._flowing.is_set():
                    continue
                data = src.recv(_CHUNK)
                if not data:  # orderly close from this side: pass the half-close on
                    dst.shutdown(socket.SHUT_WR)
                    break
                dst.sendall(data)
        except (OSError, ValueError):  # reset by a peer, or the pair was cut under us
            failed = True
        if failed or pair.half_done():
            with self._lock:
                self._pairs.discard(pair)
            pair.close(reset=failed)


# ---- the rig: extender replicas behind fault points, against a running cluster ----

EXTENDER_PREFIX = "gpupack-extender-"
NEVER_STALE_S = 86400.0  # GPUNodes published once by `publish_gpunodes`, kept fresh by no agent


def publish_gpunodes(
    kubeconfig: Path, nodes: Sequence[str], gpus: int, model: str, *, live_memory: bool = True
) -> None:
    """A GPUNode per node as a healthy agent reports it (every GPU idle), for rigs that run no agents.

    `live_memory=False` publishes no NVML memory reading (as when NVML could not be read), so only the
    reservations decide.
    """
    from app.kube.client import Kube

    kube = Kube.connect(str(kubeconfig))
    for name in nodes:
        spec, status = gpunode.idle(name, model, gpus, time.time(), mps=True, live_memory=live_memory)
        kube.send(gpunode.create(name, spec))
        kube.send(gpunode.patch_status(name, status))


class ExtenderRig:
    """`replicas` extenders as the scheduler and the apiserver see them, with a fault point on each path.

        kube-scheduler -> router (cluster.extender_port; only a Ready replica gets new connections)
                       -> gpupack-extender-<i> (own port)  -> apis[i] (proxy) -> kube-apiserver

    The router is what a Service does for the chart's Deployment: the leader is the only Ready replica.
    `apis[i]` is replica i's way to the apiserver: sever it to cut watches and writes, freeze it to make
    binds slow (`sever_api`/`freeze_api` act on all of them, or on one replica). Call `start` once the
    CRD and RBAC are installed; `stop` ends everything it started.
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        replicas: int = 1,
        policy: str = "binpack",
        lease_duration_s: int = 3,
        heartbeat_timeout_s: float = NEVER_STALE_S,
        drain_on_failover: bool = False,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas={replicas}: must be >= 1")
        self.cluster = cluster
        self.replicas = replicas
        self.policy = policy
        self.lease_duration_s = lease_duration_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        ports = free_ports(2 * replicas)
        self.ports = ports[:replicas]  # HTTPS, client certificate required: what kube-scheduler calls
        self.ops_ports = ports[replicas:]  # plain HTTP: healthz, readyz, metrics
        self.apis = [
            TcpProxy(fixed("127.0.0.1", cluster.ports.apiserver), name=f"extender-{i}-api")
            for i in range(replicas)
        ]
        self.router: TcpProxy | None = None
        self.drain_on_failover = drain_on_failover
        self.drained = 0  # connections cut because their replica stopped leading
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def name(self, i: int) -> str:
        return f"{EXTENDER_PREFIX}{i}"

    def url(self, i: int) -> str:
        return f"https://127.0.0.1:{self.ports[i]}"

    def ops_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ops_ports[i]}"

    def process(self, i: int) -> ManagedProcess:
        return self.cluster.process(self.name(i))

    def _spec(self, i: int, kubeconfig: Path) -> ComponentSpec:
        cert, key, client_ca = self.cluster.extender_tls
        argv = gpupack_cli(
            "extender", "serve",
            "--kubeconfig", str(kubeconfig),
            "--host", "127.0.0.1", "--port", str(self.ports[i]), "--ops-port", str(self.ops_ports[i]),
            "--tls-cert", str(cert), "--tls-key", str(key), "--client-ca", str(client_ca),
            "--policy", self.policy,
            "--lease-namespace", GPUPACK_NAMESPACE, "--lease-name", EXTENDER,
            "--lease-duration", str(self.lease_duration_s),
            "--identity", f"{self.name(i)}-{uuid.uuid4().hex[:6]}",
            "--heartbeat-timeout", str(self.heartbeat_timeout_s),
        )  # fmt: skip
        # Liveness, not readiness: a standby is never Ready, yet it is up.
        return ComponentSpec(
            self.name(i), argv, health=HealthCheck(f"{self.ops_url(i)}/healthz"), ready_timeout_s=90
        )

    def ready(self, i: int, timeout_s: float = 0.5) -> bool:
        return HealthCheck(f"{self.ops_url(i)}/readyz").probe(timeout=timeout_s)[0]

    def leader(self) -> int | None:
        """The replica whose /readyz passes (the leader with live informers), None while there is none."""
        return next((i for i in range(self.replicas) if self.ready(i)), None)

    def wait_leader(self, timeout_s: float = 60, *, but: int | None = None) -> int:
        """Until a replica (other than `but`) is Ready; its index."""
        found = wait_for(
            lambda: next(((i,) for i in range(self.replicas) if i != but and self.ready(i)), None),
            timeout_s,
            "an extender replica Ready" + ("" if but is None else f" other than {self.name(but)}"),
        )
        return found[0]

    def _apis(self, replica: int | None) -> list[TcpProxy]:
        return self.apis if replica is None else [self.apis[replica]]

    def sever_api(self, refuse_s: float = 0.0, replica: int | None = None) -> int:
        """Cut (and refuse for `refuse_s`) the API connections of one replica, or all; returns how many."""
        return sum(api.sever(refuse_s) for api in self._apis(replica))

    def freeze_api(self, replica: int | None = None) -> None:
        for api in self._apis(replica):
            api.freeze()

    def thaw_api(self) -> None:
        for api in self.apis:
            api.thaw()

    def _kubeconfig(self, i: int) -> Path:
        doc = yaml.safe_load(self.cluster.kubeconfig_for(EXTENDER).read_text())
        path = self.cluster.dir / "faults" / f"{self.name(i)}-via-proxy.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(kubeconfig_via(doc, f"https://127.0.0.1:{self.apis[i].port}")))
        path.chmod(0o600)
        return path

    def start(self, ready_timeout_s: float = 90) -> ExtenderRig:
        for api in self.apis:
            api.start()
        specs = [self._spec(i, self._kubeconfig(i)) for i in range(self.replicas)]
        self.cluster.start_processes(specs)
        picker = ReadyPicker(
            [(("127.0.0.1", port), functools.partial(self.ready, i)) for i, port in enumerate(self.ports)]
        )
        self.router = TcpProxy(picker, port=self.cluster.extender_port, name="extender-router").start()
        self.wait_leader(ready_timeout_s)
        if self.drain_on_failover:
            self._watcher = threading.Thread(target=self._drain_loop, name="rig-drain", daemon=True)
            self._watcher.start()
        return self

    def _drain_loop(self) -> None:
        """When another replica leads, cut the router's connections to the rest.

        kube-scheduler keeps its HTTP connection to the extender alive, and a Service never moves an open
        connection: without this (or a replica that closes its connections when it stops leading), the
        scheduler keeps asking a standby, which answers "not the leader", after every failover.
        """
        last: int | None = None
        while not self._watch_stop.wait(0.25):
            now = self.leader()
            if now is not None and now != last and self.router is not None:
                for i, port in enumerate(self.ports):
                    if i != now:
                        self.drained += self.router.sever_upstream(("127.0.0.1", port))
                last = now

    def freeze_replica(self, i: int) -> None:
        """SIGSTOP: the process holds its sockets and its lease record but answers nothing."""
        self.process(i).send_signal(signal.SIGSTOP)

    def resume_replica(self, i: int) -> None:
        self.process(i).send_signal(signal.SIGCONT)

    def held(self, i: int) -> int:
        """Holds in replica i's assume cache (its /state `held`, asked as kube-scheduler would)."""
        with self.cluster.extender_opener().open(f"{self.url(i)}/state", timeout=5) as resp:
            return int(json.loads(resp.read())["held"])

    def stop(self) -> None:
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        for i in range(self.replicas):
            with contextlib.suppress(KeyError):
                self.resume_replica(i)  # a stopped process cannot act on SIGTERM
                self.cluster.stop_process(self.name(i))
        if self.router is not None:
            self.router.close()
        for api in self.apis:
            api.close()
