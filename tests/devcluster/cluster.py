"""One local cluster: prepare its directory, start/stop its processes, record them in state.json."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import ssl
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.core import log
from app.kube import calls, paths
from app.kube.client import Kube, api_client

from . import components, identities, schedconfig
from .binaries import repo_root
from .layout import Layout, Ports
from .nodes import MigLayout, create_gpu_nodes
from .poll import wait_for
from .ports import free_ports
from .processes import ComponentError, ComponentSpec, ManagedProcess, log_tail, start_and_wait, wait_healthy
from .processes import start as start_process_only

_log = log.get("gpupack.devcluster")
STATE_VERSION = 1
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Serialize `up`/`down` on one directory (two concurrent `up`s would start two clusters on one state)."""
    directory.mkdir(parents=True, exist_ok=True)
    with Layout(directory).lock.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int
    alive: bool
    healthy: bool
    detail: str


class Cluster:
    """A dev/test cluster rooted at one directory: `prepare` makes a fresh one, `load` reads state.json."""

    def __init__(
        self,
        layout: Layout,
        bin_dir: Path,
        ports: Ports,
        tokens: Mapping[str, str],
        *,
        processes: list[ManagedProcess] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.layout = layout
        self.bin_dir = bin_dir
        self.ports = ports
        self._tokens = dict(tokens)
        self.processes: list[ManagedProcess] = processes or []
        self.meta: dict[str, Any] = meta or {}

    # ---- creation and persistence ----

    @classmethod
    def prepare(
        cls,
        directory: Path,
        bin_dir: Path,
        *,
        scheduler_template: Path | None = None,
        scheduler_overrides: Mapping[str, Any] = schedconfig.TEST_OVERRIDES,
    ) -> Cluster:
        """Write a fresh PKI, tokens, kubeconfigs and configs into `directory`, replacing older ones."""
        layout = Layout(directory.resolve())
        layout.dir.mkdir(parents=True, exist_ok=True)
        previous = cls.load(layout.dir)
        if previous is not None and any(p.alive() for p in previous.processes):
            raise RuntimeError(f"{layout.dir} holds a running cluster; stop it first (make down)")
        for path in layout.generated():
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        ports = Ports(*free_ports(9))
        tokens = identities.new_tokens()
        layout.pki.write()
        _write_private(layout.tokens_csv, identities.token_csv(tokens))
        _write_private(layout.tokens_json, json.dumps(tokens, indent=2) + "\n")
        server = f"https://127.0.0.1:{ports.apiserver}"
        for ident in identities.IDENTITIES:
            doc = identities.kubeconfig(server, str(layout.pki.ca.cert), ident.user, tokens[ident.key])
            _write_private(layout.kubeconfig_for(ident.key), yaml.safe_dump(doc, sort_keys=False))
        template = scheduler_template or _default_scheduler_template()
        rendered = schedconfig.render(
            template.read_text(),
            kubeconfig=str(layout.kubeconfig_for("scheduler")),
            extender_url=f"https://127.0.0.1:{ports.extender}",
            tls=schedconfig.ExtenderTLS(
                ca_file=str(layout.pki.ca.cert),
                cert_file=str(layout.pki.scheduler_client.cert),
                key_file=str(layout.pki.scheduler_client.key),
            ),
            overrides=scheduler_overrides,
        )
        layout.scheduler_config.write_text(yaml.safe_dump(rendered, sort_keys=False))
        layout.kwok_config.write_text(components.KWOK_CONFIG)
        layout.logs.mkdir(exist_ok=True)
        cluster = cls(layout, bin_dir, ports, tokens)
        cluster.save()
        return cluster

    @classmethod
    def load(cls, directory: Path) -> Cluster | None:
        """The cluster recorded in `directory`/state.json, or None if there is none."""
        layout = Layout(directory.resolve())
        try:
            raw = json.loads(layout.state.read_text())
        except FileNotFoundError:
            return None
        if raw.get("version") != STATE_VERSION:
            raise ValueError(f"{layout.state}: unsupported state version {raw.get('version')!r}")
        tokens = json.loads(layout.tokens_json.read_text())
        return cls(
            layout,
            Path(raw["bin_dir"]),
            Ports.from_json(raw["ports"]),
            tokens,
            processes=[ManagedProcess.from_json(p) for p in raw["processes"]],
            meta=raw.get("meta", {}),
        )

    def save(self) -> None:
        state = {
            "version": STATE_VERSION,
            "bin_dir": str(self.bin_dir),
            "ports": self.ports.to_json(),
            "processes": [p.to_json() for p in self.processes],
            "meta": self.meta,
        }
        tmp = self.layout.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.layout.state)  # atomic: `status` in another shell never reads half a file

    # ---- what other components need to connect ----

    @property
    def dir(self) -> Path:
        return self.layout.dir

    @property
    def kubeconfig(self) -> Path:
        return self.layout.kubeconfig

    def kubeconfig_for(self, identity: str) -> Path:
        self._check_identity(identity)
        return self.layout.kubeconfig_for(identity)

    def token(self, identity: str) -> str:
        self._check_identity(identity)
        return self._tokens[identity]

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def ca_file(self) -> Path:
        return self.layout.pki.ca.cert

    @property
    def ca_bundle(self) -> str:
        """Base64 of the CA PEM: the `caBundle` of a webhook configuration for the webhook serving cert."""
        return base64.b64encode(self.ca_file.read_bytes()).decode()

    @property
    def extender_port(self) -> int:
        return self.ports.extender

    @property
    def extender_url(self) -> str:
        """Mutual TLS: a caller needs `extender_client_cert` (as kube-scheduler has it) and `ca_file`."""
        return f"https://127.0.0.1:{self.ports.extender}"

    @property
    def extender_ops_port(self) -> int:
        """The extender's plain-HTTP port: /healthz, /readyz, /metrics only."""
        return self.ports.extender_ops

    @property
    def extender_tls(self) -> tuple[Path, Path, Path]:
        """(serving cert, serving key, client CA): the extender's --tls-cert, --tls-key, --client-ca."""
        pki = self.layout.pki
        return pki.extender.cert, pki.extender.key, pki.extender_client_ca.cert

    @property
    def extender_client_cert(self) -> tuple[Path, Path]:
        """The scheduler's client certificate and key: what a test presents to call the extender."""
        return self.layout.pki.scheduler_client.cert, self.layout.pki.scheduler_client.key

    def extender_tls_flags(self) -> tuple[str, ...]:
        """`gpupack extender serve` flags for this cluster's PKI and ops port (besides --port, --host)."""
        cert, key, client_ca = self.extender_tls
        return (
            "--ops-port", str(self.ports.extender_ops),
            "--tls-cert", str(cert), "--tls-key", str(key), "--client-ca", str(client_ca),
        )  # fmt: skip

    def extender_opener(self) -> urllib.request.OpenerDirector:
        """A urllib opener for the extender's HTTPS port, as kube-scheduler (never through a proxy)."""
        return urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self.extender_ssl_context())
        )

    def extender_ssl_context(self) -> ssl.SSLContext:
        """A client context for the extender's HTTPS port: trusts `ca_file`, presents the scheduler's cert."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(*self.extender_client_cert)
        return ctx

    @property
    def webhook_port(self) -> int:
        return self.ports.webhook

    @property
    def webhook_cert_file(self) -> Path:
        return self.layout.pki.webhook.cert

    @property
    def webhook_key_file(self) -> Path:
        return self.layout.pki.webhook.key

    def api_client(self, identity: str = "admin") -> Any:
        """A `kubernetes.client.ApiClient` authenticated as `identity` (see `app.kube.client.api_client`)."""
        return api_client(self.kubeconfig_for(identity))

    def _check_identity(self, identity: str) -> None:
        if identity not in identities.IDENTITY_KEYS:
            raise KeyError(f"unknown identity {identity!r}; known: {', '.join(identities.IDENTITY_KEYS)}")

    # ---- processes ----

    def start(self, progress: Progress = _quiet) -> None:
        """Start the control plane in order, each healthy before the next; on failure stop what started."""
        try:
            # meta "service_accounts" and "node_lease_s" (set before start): see components.apiserver, .kwok.
            sa = bool(self.meta.get("service_accounts"))
            lease_s = int(self.meta.get("node_lease_s", components.KWOK_NODE_LEASE_S))
            for spec in components.control_plane(
                self.bin_dir, self.layout, self.ports, service_account_admission=sa, node_lease_s=lease_s
            ):
                self.start_process(spec, progress)
                if spec.name == "kube-apiserver":
                    self._bootstrap()
        except BaseException:
            self.stop()
            raise
        _log.info("cluster started", extra={"dir": str(self.dir), **self.ports.to_json()})

    def _bootstrap(self) -> None:
        """Objects every test and component expects: the `default` and gpupack namespaces."""
        with self.api_client() as api:
            kube = Kube(api)
            ns = identities.GPUPACK_NAMESPACE
            kube.send(calls.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            # `default` comes from an apiserver controller shortly after readyz; tests create pods in it.
            wait_for(
                lambda: any(
                    ns["metadata"]["name"] == "default"
                    for ns in kube.send(calls.list_request(paths.namespaces())).get("items") or []
                ),
                30,
                "namespace default",
            )

    def start_process(self, spec: ComponentSpec, progress: Progress = _quiet) -> ManagedProcess:
        """Start a component (control plane or gpupack's own), wait until healthy, record it in state.json.

        Its output goes to logs/<name>.log; `stop` (and `make down`) stops it with the rest.
        """
        if any(p.name == spec.name and p.alive() for p in self.processes):
            raise ValueError(f"a process named {spec.name!r} is already running")
        progress(f"starting {spec.name}")
        t0 = time.monotonic()
        proc = start_and_wait(spec, self.layout.log(spec.name))
        self.processes = [p for p in self.processes if p.name != spec.name] + [proc]
        self.save()
        progress(f"{spec.name} ready in {time.monotonic() - t0:.1f}s (pid {proc.pid})")
        return proc

    def start_processes(
        self, specs: Sequence[ComponentSpec], progress: Progress = _quiet
    ) -> list[ManagedProcess]:
        """`start_process` for independent components, started together: one wait instead of one each.

        All or nothing: if one fails to become healthy, every one of them is stopped before the error.
        """
        for spec in specs:
            if any(p.name == spec.name and p.alive() for p in self.processes):
                raise ValueError(f"a process named {spec.name!r} is already running")
        t0 = time.monotonic()
        started: list[ManagedProcess] = []
        try:
            for spec in specs:
                progress(f"starting {spec.name}")
                started.append(start_process_only(spec, self.layout.log(spec.name)))
            # Sequential waits overlap: while we wait for the first, the others start up too.
            for spec, proc in zip(specs, started, strict=True):
                wait_healthy(proc, spec.ready_timeout_s)
        except BaseException:
            for proc in reversed(started):
                proc.stop(grace_s=3.0)
            raise
        names = {s.name for s in specs}
        self.processes = [p for p in self.processes if p.name not in names] + started
        self.save()
        progress(f"{len(started)} processes ready in {time.monotonic() - t0:.1f}s")
        return started

    def process(self, name: str) -> ManagedProcess:
        for proc in self.processes:
            if proc.name == name:
                return proc
        raise KeyError(f"no process {name!r}; have: {', '.join(p.name for p in self.processes)}")

    def stop_process(self, name: str) -> None:
        self.process(name).stop()
        self.processes = [p for p in self.processes if p.name != name]
        self.save()

    def restart_process(
        self,
        name: str,
        *,
        crash: bool = True,
        env: Mapping[str, str] | None = None,
        progress: Progress = _quiet,
    ) -> ManagedProcess:
        """Stop a recorded process (SIGKILL when `crash`, else SIGTERM first) and start the same argv again.

        Same argv means the same port, certificates, flags and data directory: etcd keeps its data, a
        restarted kube-apiserver serves what it served. Waits until healthy; `env` as at the first start
        (it is not recorded in state.json; the control-plane components need none).
        """
        old = self.process(name)
        if crash:
            old.kill()
        else:
            old.stop()
        spec = ComponentSpec(name, old.argv, health=old.health, env=dict(env or {}), ready_timeout_s=180)
        self.processes = [p for p in self.processes if p.name != name]
        deadline = time.monotonic() + 30
        while True:
            try:
                return self.start_process(spec, progress)
            except ComponentError as exc:
                # The port is ours, but for a moment after the kill it may still be held (another
                # harness probing for free ports, a socket not yet released): try again, briefly.
                if "address already in use" not in str(exc) or time.monotonic() > deadline:
                    raise
                _log.warning("port still in use, restarting again", extra={"component": name})
                time.sleep(0.5)

    def stop(self) -> None:
        """Stop every recorded process, newest first; raise ComponentError if any survives SIGKILL."""
        failures: list[str] = []
        for proc in reversed(self.processes):
            try:
                proc.stop()
            except ComponentError as exc:
                failures.append(str(exc))
        self.processes = []
        if self.layout.state.exists():
            self.save()
        _log.info("cluster stopped", extra={"dir": str(self.dir), "failures": len(failures)})
        if failures:
            raise ComponentError("; ".join(failures))

    def status(self) -> list[ComponentStatus]:
        out = []
        for proc in self.processes:
            alive = proc.alive()
            healthy, detail = proc.healthy() if alive else (False, "not running")
            out.append(ComponentStatus(proc.name, proc.pid, alive, healthy, detail))
        return out

    def running(self) -> bool:
        """Every control-plane component recorded, alive and healthy."""
        names = {p.name for p in self.processes}
        return set(components.CONTROL_PLANE) <= names and all(s.healthy for s in self.status())

    # ---- nodes and logs ----

    def create_gpu_nodes(
        self,
        count: int,
        gpus_per_node: int,
        model: str,
        *,
        prefix: str = "gpu-node-",
        labels: dict[str, str] | None = None,
        mig: MigLayout | None = None,
    ) -> list[str]:
        """Create fake GPU nodes (see nodes.node_body) and wait until kwok has them Ready; returns names.

        With `mig`, each node's simulated agent reports its first `mig.gpus` GPUs in MIG mode with
        those MIG devices.
        """
        with self.api_client() as api:
            return create_gpu_nodes(api, count, gpus_per_node, model, prefix=prefix, labels=labels, mig=mig)

    def log_path(self, name: str) -> Path:
        return self.layout.log(name)

    def log_tails(self, lines: int = 30, names: Sequence[str] | None = None) -> dict[str, str]:
        wanted = names if names is not None else [p.name for p in self.processes]
        return {n: log_tail(self.layout.log(n), lines) for n in wanted}


def _default_scheduler_template() -> Path:
    root = repo_root()
    if root is None or not schedconfig.template_path(root).is_file():
        raise FileNotFoundError(
            f"{schedconfig.TEMPLATE_RELPATH} not found: run gpupack from a source checkout "
            "or pass scheduler_template"
        )
    return schedconfig.template_path(root)


def default_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "gpupack" / "dev"
