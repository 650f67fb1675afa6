"""The extender's settings: one typed value with a validate() that reports every bad field at once."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from app.placement import DEFAULT_POLICY, registry


@dataclass(frozen=True, slots=True)
class Settings:
    kubeconfig: str | None = None
    host: str = "0.0.0.0"
    port: int = 8888
    policy: str = DEFAULT_POLICY
    # Filter keeps only the node the policy would pick, so kube-scheduler's own scoring cannot move a
    # pod off it and the cluster packs exactly as `gpupack simulate` predicts. Off: filter keeps every
    # fitting node and the policy only votes through prioritize.
    decide_in_filter: bool = True
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

    def validate(self) -> list[str]:
        errors: list[str] = []
        if not 0 < self.port < 65536:
            errors.append(f"port={self.port}: must be in 1..65535")
        if self.policy not in registry.names():
            errors.append(f"policy={self.policy!r}: must be one of {', '.join(registry.names())}")
        if not self.lease_namespace:
            errors.append("lease_namespace='': must name a namespace")
        if not self.identity:
            errors.append("identity='': must be non-empty")
        if not 0 < self.renew_deadline_s < self.lease_duration_s:
            limit = self.lease_duration_s
            errors.append(
                f"renew_deadline_s={self.renew_deadline_s}: must be in (0, lease_duration_s={limit})"
            )
        if self.retry_period_s <= 0 or self.retry_period_s >= self.renew_deadline_s:
            errors.append(f"retry_period_s={self.retry_period_s}: must be in (0, renew_deadline_s)")
        if self.heartbeat_timeout_s is not None and self.heartbeat_timeout_s <= 0:
            errors.append(f"heartbeat_timeout_s={self.heartbeat_timeout_s}: must be > 0")
        if self.assume_ttl_s <= 0:
            errors.append(f"assume_ttl_s={self.assume_ttl_s}: must be > 0")
        if self.resync_s <= 0:
            errors.append(f"resync_s={self.resync_s}: must be > 0")
        if self.watch_timeout_s < 1:
            errors.append(f"watch_timeout_s={self.watch_timeout_s}: must be >= 1")
        ttl_ok = self.assume_ttl_s > 0 and self.watch_timeout_s >= 1  # else reported above
        if ttl_ok and not self.watch_timeout_s < self.live_within_s < self.assume_ttl_s:
            errors.append(
                f"live_within_s={self.live_within_s}: must be in (watch_timeout_s={self.watch_timeout_s}, "
                f"assume_ttl_s={self.assume_ttl_s})"
            )
        return errors
