"""The extender's settings: one typed value with a validate() that reports every bad field at once."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from app.errors import SettingError
from app.placement import DEFAULT_POLICY, registry
from app.settings import Checker
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
}


@dataclass(frozen=True, slots=True)
class Settings:
    kubeconfig: str | None = None
    host: str = "0.0.0.0"
    port: int = 8888  # HTTPS, client certificate required: filter, prioritize, bind, state, explain
    ops_port: int = 8889  # plain HTTP for probes and Prometheus: healthz, readyz, metrics only
    # Mutual TLS with kube-scheduler: the serving pair and the CA that signs the scheduler's client cert.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    client_ca_file: str | None = None
    cert_check_interval_s: float = 1.0  # how often the three files are checked for a rotation
    policy: str = DEFAULT_POLICY
    # Filter keeps only the node the policy would pick, so kube-scheduler's own scoring cannot move a
    # pod off it and the cluster packs exactly as `gpupack simulate` predicts. Off: filter keeps every
    # fitting node and the policy only votes through prioritize.
    decide_in_filter: bool = True
    # What the policy judges a node's free share against: "learned" from the cluster's own gpupack pods on
    # its fleet, as `gpupack simulate` does with a trace (the built-in distribution while fewer than 50
    # GPU pods are known); "builtin": always the built-in distribution, fixed behaviour.
    workload: str = LEARNED
    lease_namespace: str = "gpupack-system"
    lease_name: str = "gpupack-extender"
    identity: str = field(
        default_factory=lambda: os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    )
    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    heartbeat_timeout_s: float | None = None  # None: each GPUNode's own status.staleAfterSeconds
    assume_ttl_s: float = 120.0
    resync_s: float = 600.0
    watch_timeout_s: int = 45  # server-side timeoutSeconds of each watch call
    # Not Ready once an informer's view has not been proven live (list, event, clean watch end) for
    # this long. Shorter than assume_ttl_s, so a hold cannot expire while a stale view still serves.
    live_within_s: float = 60.0
    log_level: str = "info"

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
        return check.errors

    def serving_errors(self) -> list[SettingError]:
        """What `serve` needs beyond `validate`: the extender answers kube-scheduler only over mutual TLS."""
        check = Checker(FLAGS)
        for name in ("tls_cert_file", "tls_key_file", "client_ca_file"):
            if not getattr(self, name):
                rule = "required; the scheduler-facing port serves only HTTPS with a client certificate"
                check.bad(name, None, rule)
        return check.errors
