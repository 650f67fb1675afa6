"""Leader election on a coordination.k8s.io/v1 Lease: acquire, renew, expire, optimistic concurrency."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.core import log
from app.core.errors import KubeError
from app.kube import calls
from app.kube.informers import KubeApi

LOG = log.get("gpupack.lease")


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseConfig:
    """One Lease and its timing; the extender's settings give every field but the last (their defaults
    are written there only)."""

    namespace: str
    name: str
    identity: str
    lease_duration_s: int  # how long others wait after the last renewal they saw
    renew_deadline_s: float  # a leader that could not renew for this long steps down
    retry_period_s: float
    stuck_after_s: float = 120.0  # a loop that has not ticked for this long is stuck (liveness fails)

    def __post_init__(self) -> None:
        if not self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("renew_deadline_s must be shorter than lease_duration_s")


class LeaderElector:
    """One candidate. Call `tick()` every retry period (or `run`); `is_leader` says whether to serve.

    Expiry is judged by when *we* last saw the lease record change (our clock), never by comparing the
    holder's timestamps with our clock, so clock skew between replicas cannot cause two leaders.
    Our own leadership counts from the moment a successful renewal was *sent*, and lasts the renew
    deadline, which is shorter than the lease duration others wait: `can_write()` before every write
    is the fence. The loop never dies: any failure is logged and the next tick retries.
    """

    def __init__(
        self,
        kube: KubeApi,
        config: LeaseConfig,
        *,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        on_started: Callable[[], None] = lambda: None,
        on_stopped: Callable[[], None] = lambda: None,
    ) -> None:
        self.kube = kube
        self.config = config
        self._wall = wall
        self._clock = clock
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._observed: tuple[Any, ...] | None = None  # (holder, renewTime, transitions) last seen
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # clock() of our last successful acquire/renew
        self._acquired_wall = 0.0
        self._leading = False
        self._stop = threading.Event()
        self.last_beat_at = clock()  # clock() when the loop last ticked
        self.last_error = ""
        self.thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        return (
            self._leading
            and self._renewed_at is not None
            and (self._clock() - self._renewed_at < self.config.renew_deadline_s)
        )

    def can_write(self) -> bool:
        """Leader, with a renewal sent within the renew deadline by our clock: safe to write now."""
        return self.is_leader

    def tick(self) -> bool:
        """Try to acquire or renew once; returns whether we lead afterwards. Never raises."""
        started = self._clock()
        self.last_beat_at = started
        try:
            ok = self._try_acquire_or_renew()
            self.last_error = ""
        except KubeError as exc:
            self.last_error = str(exc)
            LOG.warning(
                "lease call failed", extra={"code": exc.code, "reason": exc.reason, "error": exc.message}
            )
            ok = False
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            LOG.warning("lease tick failed", extra={"error": self.last_error}, exc_info=True)
            ok = False
        if ok:
            self._renewed_at = started  # others count expiry from no earlier than this
        self._set_leading(self.is_leader if not ok else True)
        self.last_beat_at = self._clock()
        return self._leading

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        LOG.info("leadership changed", extra={"leader": leading, "identity": self.config.identity})
        try:
            (self._on_started if leading else self._on_stopped)()
        except Exception:
            LOG.exception("leadership callback failed", extra={"leader": leading})

    def alive(self) -> tuple[bool, str]:
        """Whether the loop runs and ticks (liveness: a restart would help if not)."""
        if self.thread is None or self._stop.is_set():
            return True, "not running"
        if not self.thread.is_alive():
            return False, "lease thread is dead"
        idle = self._clock() - self.last_beat_at
        if idle > self.config.stuck_after_s:
            return False, f"lease thread stuck for {idle:.0f}s"
        return True, "alive"

    def _try_acquire_or_renew(self) -> bool:
        c = self.config
        now_wall = self._wall()
        try:
            lease = self.kube.send(calls.get_lease(c.namespace, c.name))
        except KubeError as exc:
            if not exc.is_not_found:
                raise
            spec = calls.lease_spec(c.identity, c.lease_duration_s, now_wall, now_wall, 0)
            try:
                self.kube.send(calls.create_lease(c.namespace, c.name, spec))
            except KubeError as create_exc:
                if create_exc.is_conflict:  # someone else created it first
                    return False
                raise
            self._acquired_wall = now_wall
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()
        duration = int(spec.get("leaseDurationSeconds") or c.lease_duration_s)
        mine = holder == c.identity
        expired = self._clock() - self._observed_at >= duration
        if holder and not mine and not expired:
            self._renewed_at = None  # someone else leads: step down now, not at the renew deadline
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if not mine:
            transitions += 1
            self._acquired_wall = now_wall
        acquired = self._acquired_wall if mine and self._acquired_wall else now_wall
        new_spec = calls.lease_spec(c.identity, c.lease_duration_s, acquired, now_wall, transitions)
        rv = str((lease.get("metadata") or {}).get("resourceVersion", ""))
        try:
            updated = self.kube.send(calls.update_lease(c.namespace, c.name, rv, new_spec))
        except KubeError as exc:
            if exc.is_conflict:  # another candidate wrote first: re-read next tick
                return False
            raise
        new = updated.get("spec") or new_spec
        self._observed = (new.get("holderIdentity"), new.get("renewTime"), new.get("leaseTransitions"))
        self._observed_at = self._clock()
        return True

    def release(self) -> None:
        """Give the lease up on shutdown so a standby takes over without waiting for expiry."""
        if not self._leading:
            return
        c = self.config
        try:
            lease = self.kube.send(calls.get_lease(c.namespace, c.name))
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") == c.identity:
                spec.update({"holderIdentity": "", "leaseDurationSeconds": 1})
                rv = str((lease.get("metadata") or {}).get("resourceVersion", ""))
                self.kube.send(calls.update_lease(c.namespace, c.name, rv, spec))
        except Exception as exc:
            LOG.warning("lease release failed", extra={"error": str(exc)})
        self._renewed_at = None
        self._set_leading(False)

    def run(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.config.retry_period_s)

    def start(self) -> threading.Thread:
        self.last_beat_at = self._clock()
        t = threading.Thread(target=self.run, name="lease", daemon=True)
        self.thread = t
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
