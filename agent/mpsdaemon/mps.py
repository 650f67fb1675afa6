"""Find and adopt the node's MPS control daemon, which runs in its own pod; set its defaults; report it.

The daemon (nvidia-cuda-mps-control -f, multi-user) is the chart's `mps-daemon` DaemonSet, not a child of
the agent: an agent that starts, restarts, crashes or is upgraded never starts, stops or restarts it, so
the MPS servers of running pods and their clients' GPU contexts outlive every agent. The agent only talks
to it through the control pipe (`<pipe dir>/control`, by running the control binary as a client), to learn
whether it answers and to set its defaults once per daemon instance. It never sends `quit`.

One daemon serves every shared GPU of the node (see docs/upgrades.md, "The MPS daemon's scope"): a
multi-GPU pod's process has one CUDA_MPS_PIPE_DIRECTORY, so all of its GPUs must sit behind one daemon. A
change to one GPU (unhealthy, leaves MPS) therefore never restarts the daemon: the GPU stops being offered
to new pods, and only the pods on it are told (agent.loop).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from agent.mpsdaemon.mpscontrol import Control, number
from app.core import log, names
from app.kube.gpunode import ISOLATION_MPS, ISOLATION_NONE, MpsStatus

_log = log.get("gpupack.agent.mps")


class MpsState(StrEnum):
    RUNNING = "running"  # the daemon answers on the control pipe and has this agent's defaults, read back
    # No daemon answers (its pod is starting, restarting or absent). The GPUNode CRD's older name for it:
    # Helm never upgrades a CRD, so a new agent must write only values the installed schema accepts.
    STARTING = "starting"
    UNAVAILABLE = "unavailable"  # no nvidia-cuda-mps-control binary on this node
    DISABLED = "disabled"  # turned off by config, or no shared GPUs


@dataclass(frozen=True, slots=True)
class MpsConfig:
    enabled: bool = True
    binary: str = "nvidia-cuda-mps-control"  # a name looked up on PATH, or a path
    pipe_dir: Path = Path(names.MPS_PIPE_DIRECTORY)  # host dir of the daemon's control pipe
    # Daemon-side defaults apply to every client; a client's env can only tighten them (legacy MPS).
    default_thread_percentage: int = 100
    default_pinned_mem_limit_mib: int | None = None  # None: no daemon-wide memory cap
    command_timeout_s: float = 5.0
    # A server started (`start_server -uid 0`) before any client comes: measured, EXCLUSIVE_PROCESS refuses a
    # plain process only while a server runs, and the daemon starts one only for its first client. Only for a
    # multi-user daemon (-M): its one root server serves every uid.
    prestart_server: bool = True


@dataclass(frozen=True, slots=True)
class Device:
    uuid: str
    memory_mib: int


class MpsSupervisor:
    """Drive with `tick(devices, now)` from the agent loop: probe the daemon, set its defaults, report it.

    A daemon instance is told apart by its control socket (inode and modification time): a restarted daemon
    makes a new one, and gets the defaults again; the same daemon seen by a new agent gets them once more,
    which changes nothing (setting a default to its value). Each default is read back after it is set: the
    control binary exits 0 when the daemon refuses (measured), so only the daemon's words and the value it
    then reports say that a default holds. A refusal keeps the daemon out of RUNNING with the daemon's
    words as the message: the GPUNode reports MPS not running and the node side starts no MPS client.
    With `prestart_server`, a server is started once the defaults hold, so a GPU in EXCLUSIVE_PROCESS
    refuses plain processes before the first MPS client comes; MPS is RUNNING only once it runs.

    `server_running` says whether a server ran when this cycle last asked (the daemon's `get_server_list`):
    only then does a GPU in EXCLUSIVE_PROCESS refuse a plain process (measured), so the GPUNode claims
    `exclusive` only then (agent.report.reporter).

    `stale_server` is a server that already ran when this agent changed one of the daemon's defaults: NVIDIA
    documents a changed default as reaching only servers started later, and the pre-started server lives as
    long as its daemon. While it runs, MPS is RUNNING with a message saying so, and the GPUNode claims no
    daemon-wide memory cap (agent.report.reporter).

    `lost` is set by the cycle that finds a daemon, which this agent had seen running, gone: every MPS
    client on the node failed with it (measured) and a CUDA process started meanwhile runs without limits.
    Listeners added with `on_new_daemon` run once each new daemon instance is configured (the node side
    renews the pods' links to its socket then, not at its next maintenance).

    The node side asks `not_ready()` from its own threads; a daemon found unfit is checked again then (see
    there), under the same lock as the loop's cycle. A loss such a check finds is `lost` at the loop's next
    cycle, so the loop still tells the pods.
    """

    def __init__(self, config: MpsConfig) -> None:
        self.config = config
        self.state = MpsState.STARTING
        self.message = ""
        self.restarts = 0  # daemon instances seen to replace an earlier one while this agent ran
        self._instance: tuple[int, int] | None = None
        self._configured: set[str] = set()  # devices whose pinned-memory default this instance has
        self._binary: str | None = None
        self._said: str = ""
        self.control = Control(config.binary, config.pipe_dir, config.command_timeout_s)
        self.lost = False  # this cycle found the daemon gone that an earlier one saw running
        self.server_running = False  # a server was listed by this cycle's daemon (after any pre-start)
        # A server that was running when this agent changed the daemon's defaults: it keeps the earlier ones.
        self.stale_server: int | None = None
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()  # one check at a time: the loop's cycle or a node-side re-check
        self._devices: tuple[Device, ...] = ()  # the shared GPUs of the loop's last cycle
        self._check_began = 0.0  # time.monotonic() when the last check began
        self._lost_untold = False  # a loss a node-side re-check found, for the loop's next cycle

    def on_new_daemon(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def available(self) -> bool:
        """Whether MPS can serve this node's GPUs (enabled and the binary exists)."""
        return self.config.enabled and self._find_binary() is not None

    def not_ready(self) -> str:
        """Why no MPS client may start now ("" when one may): the daemon this agent configured (defaults
        applied and read back) is the one behind the control socket now. Called by the node side for each
        MPS container. A daemon found unfit (not answering, refusing, or replaced since the loop's last
        cycle) is checked again first, unless a check began since this was asked: the loop checks only every
        few seconds, and a container refused on what the daemon was then fails for good where its pod does
        not restart it, though the daemon came up (or was configured) since."""
        why = self._why_not()
        if not why or not self._devices:  # never checked by the loop: it has not said which GPUs yet
            return why
        asked = time.monotonic()
        if not self._lock.acquire(timeout=self.config.command_timeout_s):
            return why  # a check is stuck on the daemon: its answer would come too late for this container
        try:
            if self._check_began < asked:
                _, lost = self._check(self._devices)
                self._lost_untold |= lost
        finally:
            self._lock.release()
        return self._why_not()

    def _why_not(self) -> str:
        if self.state is not MpsState.RUNNING:
            why = self.message or "not checked yet"
            return f"the MPS control daemon is not ready ({self.state.value}: {why})"
        if self._instance is None or self._instance_id() != self._instance:
            return "the MPS control daemon restarted and has not been given gpupack's defaults yet"
        return ""

    def status(self) -> MpsStatus:
        isolation = ISOLATION_MPS if self.state is MpsState.RUNNING else ISOLATION_NONE
        return MpsStatus(
            state=self.state.value, isolation=isolation, message=self.message, restarts=self.restarts
        )

    def tick(self, devices: Sequence[Device], now: float) -> MpsStatus:
        """The loop's cycle: check the daemon; `lost` says whether it (or a re-check since) found it gone."""
        del now  # probing is cheap and the daemon's lifetime is its pod's: no backoff to keep
        with self._lock:
            self._devices = tuple(devices)
            status, lost = self._check(self._devices)
            self.lost, self._lost_untold = lost or self._lost_untold, False
            return status

    def _check(self, devs: tuple[Device, ...]) -> tuple[MpsStatus, bool]:
        """Probe the daemon, configure a new one; with whether a daemon seen running was found gone."""
        self._check_began = time.monotonic()
        if not self.config.enabled or not devs:
            message = "disabled by config" if not self.config.enabled else "no shared GPUs"
            return self._set(MpsState.DISABLED, message), False
        if self._find_binary() is None:
            message = f"{self.config.binary} not found; pods get co-location without MPS isolation"
            return self._set(MpsState.UNAVAILABLE, message), False
        instance = self._instance_id()
        was_running = self.state is MpsState.RUNNING
        lost = False
        self.server_running = False
        servers = self.control.server_list() if instance is not None else "no control socket"
        if isinstance(servers, str):
            self._instance, self.stale_server = None, None
            where = self.config.pipe_dir / "control"
            message = f"no MPS control daemon answers at {where} (its pod runs it)"
            return self._set(MpsState.STARTING, message), was_running
        new = instance != self._instance
        if new:
            if self._instance is not None:
                self.restarts += 1
                lost = was_running  # replaced between two cycles: its clients died with it too
            self._instance, self._configured = instance, set()
        if self.stale_server is not None and self.stale_server not in servers:
            self.stale_server = None  # it has exited: servers started from now on have the defaults
        err = self._apply_defaults(devs, servers) or self._ensure_server(servers)
        if err:
            self._instance = None  # try the whole set again next time
            return self._set(MpsState.STARTING, err), lost
        if new:
            for listener in self._listeners:
                listener()
        return self._set(MpsState.RUNNING, self._stale_message()), lost

    def _stale_message(self) -> str:
        if self.stale_server is None:
            return ""
        return (
            f"MPS server {self.stale_server} runs with the daemon's earlier defaults: gpupack's reach "
            "servers started after it (replace the mps-daemon pod, once its MPS pods are drained)"
        )

    def _set(self, state: MpsState, message: str) -> MpsStatus:
        said = f"{state.value}: {message}"
        if said != self._said:  # each change once, not every cycle
            level = _log.info if state in (MpsState.RUNNING, MpsState.DISABLED) else _log.warning
            level("MPS control daemon", extra={"state": state.value, "error": message})
            self._said = said
        self.state, self.message = state, message
        return self.status()

    def _find_binary(self) -> str | None:
        if self._binary is None:
            self._binary = self.control.found()
        return self._binary

    def _instance_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.config.pipe_dir / "control")
        except OSError:
            return None
        # Not the change time: every pod directory's hard link to the socket changes it (the link count).
        return st.st_ino, st.st_mtime_ns

    def _ensure_server(self, servers: list[int]) -> str:
        """A server running before any client ("" when one runs, or none is wanted; else why not), given the
        servers the daemon listed this cycle; sets `server_running`."""
        self.server_running = bool(servers)
        if servers or not self.config.prestart_server:
            return ""
        started = self.control.command("start_server -uid 0")
        if not started.ok:
            return f"'start_server -uid 0' refused: {started}"
        listed = self.control.server_list()
        if not listed or isinstance(listed, str):
            return f"no MPS server runs after 'start_server -uid 0' ({listed or 'none listed'})"
        self.server_running = True
        return ""

    def _apply_defaults(self, devices: tuple[Device, ...], servers: list[int]) -> str:
        """The configured defaults on this daemon instance, each read back: the thread share once, each
        device's memory cap once (a GPU that joins later gets its own then; one that leaves keeps its
        harmless default). "" when all hold, else what the daemon said."""
        steps: list[tuple[str, str, float]] = []
        if not self._configured:
            pct = self.config.default_thread_percentage
            steps.append(
                (f"set_default_active_thread_percentage {pct}", "get_default_active_thread_percentage", pct)
            )
        limit = self.config.default_pinned_mem_limit_mib
        for d in devices:
            if d.uuid not in self._configured and limit is not None:
                steps.append((
                    f"set_default_device_pinned_mem_limit {d.uuid} {limit}M",
                    f"get_default_device_pinned_mem_limit {d.uuid}",
                    limit,
                ))  # fmt: skip
        changed = False
        for set_, get, want in steps:
            before = self.control.command(get)
            was = number(before.text) if before.ok else None
            changed |= was is None or abs(was - want) > 0.5
            done = self.control.command(set_)
            if not done.ok:
                return f"{set_!r} refused: {done}"
            back = self.control.command(get)
            got = number(back.text) if back.ok else None
            if got is None or abs(got - want) > 0.5:
                said = back.text if back.ok else str(back)
                return f"{set_!r} did not hold: {get!r} says {said[:200]!r}"
        self._configured |= {"", *(d.uuid for d in devices)}
        if changed and servers:
            # NVIDIA: a default changed while a server runs "will only affect the next server".
            self.stale_server = servers[0]
        return ""
