"""Start and supervise the MPS control daemon (nvidia-cuda-mps-control -d) for the node's shared GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from app import log, names
from app.kube.gpunode import ISOLATION_MPS, ISOLATION_NONE, MpsStatus

_log = log.get("gpupack.agent.mps")


class MpsState(StrEnum):
    RUNNING = "running"
    STARTING = "starting"
    BACKOFF = "backoff"  # died or failed to start; the next attempt waits (exponential backoff)
    UNAVAILABLE = "unavailable"  # no nvidia-cuda-mps-control binary on this node
    DISABLED = "disabled"  # turned off by config, or no shared GPUs


@dataclass(frozen=True, slots=True)
class MpsConfig:
    enabled: bool = True
    binary: str = "nvidia-cuda-mps-control"  # a name looked up on PATH, or a path
    pipe_dir: Path = Path(names.MPS_PIPE_DIRECTORY)  # host dir; the webhook mounts the same into MPS pods
    log_dir: Path = Path("/var/log/nvidia-mps")
    # Daemon-side defaults apply to every client; a client's env can only tighten the thread share.
    default_thread_percentage: int = 100
    default_pinned_mem_limit_mib: int | None = None  # None: each device's own memory size
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    command_timeout_s: float = 5.0


@dataclass(frozen=True, slots=True)
class Device:
    uuid: str
    memory_mib: int


class MpsSupervisor:
    """Drive with `tick(devices, now)` from the agent loop; it probes, (re)starts and configures the daemon.

    The daemon is probed with `get_server_list` through the control pipe. A daemon already running
    under the pipe dir (e.g. left by a previous agent) is adopted, not started twice.
    """

    def __init__(self, config: MpsConfig) -> None:
        self.config = config
        self.state = MpsState.STARTING
        self.message = ""
        self.restarts = 0
        self._devices: tuple[Device, ...] = ()
        self._next_attempt = 0.0
        self._backoff = config.backoff_initial_s
        self._binary: str | None = None
        self._said_unavailable = False

    def available(self) -> bool:
        """Whether MPS can serve this node's GPUs (enabled and the binary exists)."""
        return self.config.enabled and self._find_binary() is not None

    def status(self) -> MpsStatus:
        isolation = ISOLATION_MPS if self.state is MpsState.RUNNING else ISOLATION_NONE
        return MpsStatus(
            state=self.state.value, isolation=isolation, message=self.message, restarts=self.restarts
        )

    def tick(self, devices: Sequence[Device], now: float) -> MpsStatus:
        devs = tuple(devices)
        if not self.config.enabled or not devs:
            if self.state is MpsState.RUNNING:
                self._quit()
            self.state, self.message = (
                MpsState.DISABLED,
                "disabled by config" if not self.config.enabled else "no shared GPUs",
            )
            return self.status()
        binary = self._find_binary()
        if binary is None:
            self.state = MpsState.UNAVAILABLE
            self.message = f"{self.config.binary} not found; pods get co-location without MPS isolation"
            if not self._said_unavailable:
                _log.warning("MPS unavailable: isolation is none", extra={"binary": self.config.binary})
                self._said_unavailable = True
            return self.status()
        if self.state is MpsState.RUNNING:
            if devs != self._devices:
                _log.info("shared GPUs changed; restarting MPS", extra={"gpus": [d.uuid for d in devs]})
                self._quit()
                self.state, self._next_attempt = MpsState.STARTING, now
            elif self._probe():
                return self.status()
            else:
                self.restarts += 1
                self._fail(now, "MPS control daemon died")
        if now < self._next_attempt:
            return self.status()
        self._devices = devs
        if not self._probe():
            err = self._start(binary)
            if err:
                self._fail(now, f"starting MPS failed: {err}")
                return self.status()
        if not self._probe():
            self._fail(now, "MPS control daemon is not answering after start")
            return self.status()
        err = self._apply_defaults()
        if err:
            self._fail(now, err)
            return self.status()
        self.state, self.message, self._backoff = MpsState.RUNNING, "", self.config.backoff_initial_s
        _log.info(
            "MPS control daemon running",
            extra={"gpus": [d.uuid for d in devs], "pipe_dir": str(self.config.pipe_dir)},
        )
        return self.status()

    def stop(self) -> None:
        if self.state is MpsState.RUNNING:
            self._quit()
        self.state = MpsState.DISABLED

    def _fail(self, now: float, message: str) -> None:
        self.state, self.message = MpsState.BACKOFF, message
        self._next_attempt = now + self._backoff
        _log.warning("MPS not running; retrying", extra={"error": message, "retry_in_s": self._backoff})
        self._backoff = min(self._backoff * 2, self.config.backoff_max_s)

    def _find_binary(self) -> str | None:
        if self._binary is None:
            found = shutil.which(self.config.binary)
            self._binary = found
        return self._binary

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                names.ENV_MPS_PIPE_DIRECTORY: str(self.config.pipe_dir),
                "CUDA_MPS_LOG_DIRECTORY": str(self.config.log_dir),
                # The daemon's device ordinals (used by the set_default_* commands) follow this order.
                names.ENV_CUDA_VISIBLE_DEVICES: ",".join(d.uuid for d in self._devices),
            }
        )
        return env

    def _run(self, argv: list[str], stdin: str) -> subprocess.CompletedProcess[str] | None:
        self.config.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.config.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            return subprocess.run(
                argv,
                input=stdin,
                env=self._env(),
                capture_output=True,
                text=True,
                timeout=self.config.command_timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            _log.warning("MPS control command failed", extra={"argv": argv, "error": str(exc)})
            return None

    def _start(self, binary: str) -> str:
        """Run `<binary> -d`; its output goes to a file, because the daemon it forks inherits our fds
        and a pipe would stay open (and block us) for the daemon's whole life."""
        self.config.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.config.log_dir.mkdir(parents=True, exist_ok=True)
        out_path = self.config.log_dir / "gpupack-start.log"
        try:
            with open(out_path, "w+b") as out:
                rc = subprocess.run(
                    [binary, "-d"],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    env=self._env(),
                    timeout=self.config.command_timeout_s,
                    check=False,
                ).returncode
                out.seek(0)
                text = out.read(400).decode(errors="replace").strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        return "" if rc == 0 else (text or f"exit {rc}")

    def _control(self, command: str) -> subprocess.CompletedProcess[str] | None:
        binary = self._find_binary()
        return None if binary is None else self._run([binary], command + "\n")

    def _probe(self) -> bool:
        out = self._control("get_server_list")
        return out is not None and out.returncode == 0

    def _apply_defaults(self) -> str:
        commands = [f"set_default_active_thread_percentage {self.config.default_thread_percentage}"]
        for ordinal, d in enumerate(self._devices):
            limit = self.config.default_pinned_mem_limit_mib or d.memory_mib
            commands.append(f"set_default_device_pinned_mem_limit {ordinal} {limit}M")
        for cmd in commands:
            out = self._control(cmd)
            if out is None or out.returncode != 0:
                return f"{cmd!r} failed: {_text(out)}"
        return ""

    def _quit(self) -> None:
        self._control("quit")


def _text(out: subprocess.CompletedProcess[str] | None) -> str:
    if out is None:
        return "no answer"
    return (out.stderr or out.stdout).strip()[:200] or f"exit {out.returncode}"
