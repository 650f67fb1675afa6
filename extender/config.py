"""The extender's settings: one typed value with a validate() that reports every bad field at once."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from app.core.autoscale.plan import Pool
from app.core.errors import SettingError
from app.core.placement import DEFAULT_POLICY, registry
from app.service.settings import Checker, setting
from extender.workloads import LEARNED, SOURCES

# Settings fields whose flag is not just the field name in kebab case.
FLAGS = {
    "tls_cert_file": "--tls-cert",
    "tls_key_file": "--tls-key",
    "client_ca_file": "--client-ca",
    "cert_check_interval_s": "--cert-check-interval",
    "lease_duration_s": "--lease-duration",
    "heartbeat_timeout_s": "--heartbeat-timeout",
    "watch_timeout_s": "--watch-timeout",
    "live_within_s": "--live-within",
    "decide_in_filter": "--no-decide-in-filter",
    "autoscale_pools": "--autoscale-pool",
    "autoscale_interval_s": "--autoscale-interval",
    "autoscale_grace_s": "--autoscale-grace",
}


@dataclass(frozen=True, slots=True)
class Settings:
    kubeconfig: str | None = setting(None, "kubeconfig file", shown="in-cluster, then ~/.kube/config")
    host: str = setting("0.0.0.0", "listen address of both ports")
    port: int = setting(
        8888,
        "HTTPS port for kube-scheduler (client certificate required): filter, prioritize, bind, state and "
        "explain",
    )
    ops_port: int = setting(
        8889, "plain HTTP port with only healthz, readyz, metrics, for probes and Prometheus"
    )
    # Mutual TLS with kube-scheduler: the serving pair and the CA that signs the scheduler's client cert.
    tls_cert_file: str | None = setting(None, "PEM serving certificate of --port (reloaded when it changes)")
    tls_key_file: str | None = setting(None, "PEM private key of --tls-cert")
    client_ca_file: str | None = setting(
        None,
        "PEM CA bundle: a caller of --port must present a client certificate signed by it "
        "(kube-scheduler's extender tlsConfig certFile/keyFile)",
    )
    cert_check_interval_s: float = setting(1.0, "seconds between checks of the TLS files for a rotation")
    policy: str = setting(DEFAULT_POLICY, f"placement policy: {', '.join(registry.names())}")
    # Filter keeps only the node the policy would pick, so kube-scheduler's own scoring cannot move a
    # pod off it and the cluster packs exactly as `gpupack simulate` predicts. Off: filter keeps every
    # fitting node and the policy only votes through prioritize.
    decide_in_filter: bool = setting(
        True, "let every fitting node pass filter and only rank them in prioritize"
    )  # its flag is --no-decide-in-filter
    # What the policy judges a node's free share against: "learned" from the cluster's own gpupack pods on
    # its fleet, as `gpupack simulate` does with a trace (the built-in distribution while fewer than 50
    # GPU pods are known); "builtin": always the built-in distribution, fixed behaviour.
    workload: str = setting(
        LEARNED,
        "target workload of the policy: learned from the cluster's gpupack pods and fleet, or the "
        "built-in distribution",
    )
    lease_namespace: str = setting("gpupack-system", "namespace of the leader-election Lease")
    lease_name: str = setting("gpupack-extender", "name of the leader-election Lease")
    identity: str = setting(
        help="leader-election identity",
        shown="$POD_NAME, else host-pid",
        factory=lambda: os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
    )
    lease_duration_s: int = setting(15, "lease duration, seconds")
    # Renew deadline and retry period follow the lease duration (extender.command.settings_from).
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    heartbeat_timeout_s: float | None = setting(
        None,
        "treat a GPUNode whose heartbeat is older than this many seconds as unschedulable",
        shown="the agent's own status.staleAfterSeconds",
    )
    assume_ttl_s: float = 120.0
    resync_s: float = 600.0
    watch_timeout_s: int = setting(45, "server-side timeout of each watch call, seconds")
    # Not Ready once an informer's view has not been proven live (list, event, clean watch end) for
    # this long. Shorter than assume_ttl_s, so a hold cannot expire while a stale view still serves.
    live_within_s: float = setting(
        60.0,
        "report not ready when the cluster view has not been proven live for this many seconds "
        "(must exceed --watch-timeout)",
    )
    log_level: str = setting("info", "log level: debug, info, warning, error")
    # Scale-up requests to a cluster autoscaler (extender/autoscaler.py): the node shapes it can add, as
    # MODEL:GPUS; none turns the requests off. Pods pending for `grace` are sized every `interval`.
    autoscale_pools: tuple[str, ...] | None = setting(
        None,
        "a node shape the cluster autoscaler can add, MODEL:GPUS (repeat for several, in order of "
        "preference); with one, the leader asks for GPU nodes with placeholder pods sized by its own "
        "packing (docs/autoscaling.md)",
    )
    autoscale_interval_s: float = setting(5.0, "seconds between two scale-up reconciles")
    autoscale_grace_s: float = setting(5.0, "seconds a pod is pending before it counts toward a scale-up")
    autoscale_resource: str = setting(
        "nvidia.com/gpu", "the resource a placeholder pod requests per whole GPU"
    )

    def validate(self) -> list[SettingError]:
        check = Checker(FLAGS)
        check.port("port", self.port)
        if not 0 < self.ops_port < 65536 or self.ops_port == self.port:
            check.bad("ops_port", self.ops_port, f"must be in 1..65535 and differ from port={self.port}")
        files = {"tls_cert_file": self.tls_cert_file, "tls_key_file": self.tls_key_file}
        files["client_ca_file"] = self.client_ca_file
        if any(files.values()):  # an app without TLS settings (tests); `serving_errors` insists on them
            for name, path in files.items():
                rule = "must name a readable PEM file (all three TLS files go together)"
                check.readable_file(name, path, rule)
        check.positive("cert_check_interval_s", self.cert_check_interval_s)
        if self.policy not in registry.names():
            check.bad("policy", self.policy, f"must be one of {', '.join(registry.names())}")
        if self.workload not in SOURCES:
            check.bad("workload", self.workload, f"must be one of {', '.join(SOURCES)}")
        if not self.lease_namespace:
            check.bad("lease_namespace", self.lease_namespace, "must name a namespace")
        if not self.identity:
            check.bad("identity", self.identity, "must be non-empty")
        if not 0 < self.renew_deadline_s < self.lease_duration_s:
            rule = f"must be in (0, lease_duration_s={self.lease_duration_s})"
            check.bad("renew_deadline_s", self.renew_deadline_s, rule)
        if self.retry_period_s <= 0 or self.retry_period_s >= self.renew_deadline_s:
            check.bad("retry_period_s", self.retry_period_s, "must be in (0, renew_deadline_s)")
        if self.heartbeat_timeout_s is not None:
            check.positive("heartbeat_timeout_s", self.heartbeat_timeout_s)
        check.positive("assume_ttl_s", self.assume_ttl_s)
        check.positive("resync_s", self.resync_s)
        if self.watch_timeout_s < 1:
            check.bad("watch_timeout_s", self.watch_timeout_s, "must be >= 1")
        ttl_ok = self.assume_ttl_s > 0 and self.watch_timeout_s >= 1  # else reported above
        if ttl_ok and not self.watch_timeout_s < self.live_within_s < self.assume_ttl_s:
            rule = f"must be in (watch_timeout_s={self.watch_timeout_s}, assume_ttl_s={self.assume_ttl_s})"
            check.bad("live_within_s", self.live_within_s, rule)
        for raw in self.autoscale_pools or ():
            try:
                Pool.parse(raw)
            except ValueError as exc:
                check.bad("autoscale_pools", raw, str(exc).removeprefix(f"{raw!r}: "))
        check.positive("autoscale_interval_s", self.autoscale_interval_s)
        if self.autoscale_grace_s < 0:
            check.bad("autoscale_grace_s", self.autoscale_grace_s, "must be >= 0")
        if "/" not in self.autoscale_resource:
            rule = "must be an extended resource name with a domain, e.g. nvidia.com/gpu"
            check.bad("autoscale_resource", self.autoscale_resource, rule)
        return check.errors

    def serving_errors(self) -> list[SettingError]:
        """What `serve` needs beyond `validate`: the extender answers kube-scheduler only over mutual TLS."""
        check = Checker(FLAGS)
        for name in ("tls_cert_file", "tls_key_file", "client_ca_file"):
            if not getattr(self, name):
                rule = "required; the scheduler-facing port serves only HTTPS with a client certificate"
                check.bad(name, None, rule)
        return check.errors
