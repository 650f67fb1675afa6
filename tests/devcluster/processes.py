"""Managed local processes: start with a log file, wait until healthy, stop by process group, verify gone."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.core import log

from .poll import WaitTimeoutError, wait_for

_log = log.get("gpupack.devcluster")


@dataclass(frozen=True)
class HealthCheck:
    """An HTTP(S) GET that answers 200 (and contains `expect`, if given) when the process is ready."""

    url: str
    ca_file: str | None = None  # verify the server against this CA; None for https means "don't verify"
    token: str | None = None  # bearer token, for endpoints that are not anonymous
    expect: str | None = None

    def probe(self, timeout: float = 2.0) -> tuple[bool, str]:
        """(healthy, short detail); never raises for network errors."""
        req = urllib.request.Request(self.url)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]  # never proxy loopback
        if self.url.startswith("https:"):
            ctx = ssl.create_default_context(cafile=self.ca_file)
            if self.ca_file is None:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        opener = urllib.request.build_opener(*handlers)
        try:
            with opener.open(req, timeout=timeout) as resp:
                body = resp.read(4096).decode("utf-8", "replace")
                ok = resp.status == 200 and (self.expect is None or self.expect in body)
                return ok, f"{resp.status} {body.strip()[:80]}"
        except urllib.error.HTTPError as exc:
            return False, f"{exc.code} {exc.read(200).decode('utf-8', 'replace').strip()[:80]}"
        except (OSError, ssl.SSLError) as exc:
            return False, type(exc).__name__ + ": " + str(exc)[:80]


@dataclass(frozen=True)
class ComponentSpec:
    """What to run: the argv, extra env (on top of ours), and how to tell it is ready."""

    name: str
    argv: tuple[str, ...]
    health: HealthCheck | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 60.0


class ComponentError(RuntimeError):
    """A component exited or never became healthy; the message ends with the tail of its log."""


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name: [state, ppid, pgrp, session, ...]."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may contain spaces and parentheses; it ends at the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process start time in clock ticks since boot: with the pid, a unique process identity."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def pid_alive(pid: int, ticks: int | None = None) -> bool:
    """True while `pid` runs (zombies count as gone); with `ticks`, only if it is still the same process."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == ticks


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ManagedProcess:
    """A started component. `pid` leads its own session, so pid == pgid and the group holds its children."""

    name: str
    pid: int
    ticks: int
    log_path: str
    argv: tuple[str, ...]
    health: HealthCheck | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        if self.popen is not None:
            self.popen.poll()  # reap our own child so it does not linger as a zombie
        return pid_alive(self.pid, self.ticks)

    def healthy(self) -> tuple[bool, str]:
        if not self.alive():
            return False, "not running"
        if self.health is None:
            return True, "running (no health check)"
        return self.health.probe()

    def tail(self, lines: int = 40) -> str:
        return log_tail(Path(self.log_path), lines)

    def to_json(self) -> dict[str, Any]:
        # Field by field: asdict() would deep-copy the Popen handle, which cannot be copied.
        return {
            "name": self.name,
            "pid": self.pid,
            "ticks": self.ticks,
            "log_path": self.log_path,
            "argv": list(self.argv),
            "health": asdict(self.health) if self.health else None,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ManagedProcess:
        health = raw.get("health")
        return cls(
            name=raw["name"],
            pid=int(raw["pid"]),
            ticks=int(raw["ticks"]),
            log_path=raw["log_path"],
            argv=tuple(raw["argv"]),
            health=HealthCheck(**health) if health else None,
        )

    def _gone(self) -> bool:
        return not self.alive() and not group_members(self.pid)

    def send_signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the whole group (SIGSTOP freezes it, SIGCONT resumes it); no-op once it is gone."""
        if self._gone():
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return
        _log.info("component signalled", extra={"component": self.name, "pid": self.pid, "signal": sig.name})

    def kill(self, timeout_s: float = 10.0) -> None:
        """SIGKILL the group at once, as a crash would, and wait until every member is gone."""
        self.send_signal(signal.SIGKILL)
        try:
            wait_for(self._gone, timeout_s, f"{self.name} exit after SIGKILL", interval=0.05)
        except WaitTimeoutError:
            raise ComponentError(
                f"{self.name}: still running after SIGKILL: {group_members(self.pid)}"
            ) from None
        if self.popen is not None:
            self.popen.poll()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the group, wait up to `grace_s`, then SIGKILL; raise if anything of the group survives."""
        # Signal the group only while it is provably ours: the leader still has its recorded start time,
        # or other members keep the pgid in use (Linux does not reuse a pid that is still a pgid).
        if self._gone():
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            try:
                wait_for(self._gone, wait_s, f"{self.name} exit")
                break
            except WaitTimeoutError:
                _log.warning("component ignored signal", extra={"component": self.name, "signal": sig.name})
        if self.popen is not None:
            self.popen.poll()
        left = group_members(self.pid)
        if self.alive() or left:
            raise ComponentError(f"{self.name}: processes still running after SIGKILL: {left or [self.pid]}")
        _log.info("component stopped", extra={"component": self.name, "pid": self.pid})


def start(spec: ComponentSpec, log_path: Path) -> ManagedProcess:
    """Start `spec` in its own session (it survives our exit; it is killed as a group), logging to a file."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **spec.env}
    with log_path.open("ab") as out:
        out.write(f"==== {time.strftime('%Y-%m-%dT%H:%M:%S')} start: {' '.join(spec.argv)}\n".encode())
        out.flush()
        popen = subprocess.Popen(
            spec.argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    ticks = start_ticks(popen.pid)
    if ticks is None:  # exited before we could look: report it with its log
        popen.wait()
        raise ComponentError(f"{spec.name} exited at once (code {popen.returncode}):\n{log_tail(log_path)}")
    proc = ManagedProcess(spec.name, popen.pid, ticks, str(log_path), spec.argv, spec.health, popen)
    _log.info("component started", extra={"component": spec.name, "pid": popen.pid, "log": str(log_path)})
    return proc


def wait_healthy(proc: ManagedProcess, timeout_s: float) -> float:
    """Poll the health check until it passes; fail fast if the process dies. Returns seconds waited."""
    t0 = time.monotonic()
    last = ["no probe yet"]

    def ready() -> bool:
        if not proc.alive():
            code = proc.popen.returncode if proc.popen is not None else "?"
            raise ComponentError(f"{proc.name} exited (code {code}) before it was healthy:\n{proc.tail()}")
        ok, last[0] = proc.health.probe() if proc.health else (True, "")
        return ok

    try:
        wait_for(ready, timeout_s, f"{proc.name} health", interval=0.25)
    except WaitTimeoutError:
        raise ComponentError(
            f"{proc.name} not healthy after {timeout_s:.0f}s (last probe: {last[0]}):\n{proc.tail()}"
        ) from None
    took = time.monotonic() - t0
    _log.info("component healthy", extra={"component": proc.name, "pid": proc.pid, "seconds": round(took, 2)})
    return took


def start_and_wait(spec: ComponentSpec, log_path: Path) -> ManagedProcess:
    """Start and wait for health; on failure the process is stopped before the error propagates."""
    proc = start(spec, log_path)
    try:
        wait_healthy(proc, spec.ready_timeout_s)
    except BaseException:
        proc.stop(grace_s=3.0)
        raise
    return proc
