"""The node agent's wiring: build(settings) → Agent, the cycle Runner, and create_app(settings, agent)."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent import metrics
from agent.enforce import memlimits
from agent.enforce.cgroup import ProcResolver, SimulatedOrHost
from agent.enforce.ending import HostProcesses
from agent.enforce.limiter import Limiter
from agent.enforce.watchdog import Policy
from agent.loop import Agent, AgentConfig, Resolver
from agent.mpsdaemon import mpsprep
from agent.mpsdaemon.drain import ClientLists
from agent.mpsdaemon.mps import MpsConfig, MpsSupervisor
from agent.mpsdaemon.mpscontrol import Control
from agent.mpsdaemon.mpsv3 import Namespaces
from agent.mpsdaemon.pipedirs import PipeDirs
from agent.nvml.base import BackendConfigError, ComputeMode, Nvml, NvmlError
from agent.report.isolation import NodeFacts
from agent.report.reporter import ReporterConfig
from agent.runtime import nodepods, nodeside, toolkit
from agent.runtime.nodeserver import NodeServer
from agent.settings import Settings
from app.core import log
from app.kube.calls import Request
from app.kube.informers import KubeApi

if TYPE_CHECKING:  # the simulated GPU is imported only where settings choose it (make_nvml)
    from agent.simgpu.simalloc import Allocator

_log = log.get("gpupack.agent")


# Where a GPU container finds the simulated allocator's socket (simulated GPUs only; agent.simgpu.simalloc).
SIM_GPU_DIR = "/run/gpupack/sim-gpu"


def host_cgroup2_root(proc_root: Path) -> str:
    """Where the host mounts cgroup v2 (its pid 1's mounts), "" on a v1-only node or where unreadable."""
    try:
        return memlimits.cgroup2_mount((proc_root / "1" / "mountinfo").read_text())
    except OSError:
        return ""


def make_nvml(
    sim: Path | None, node: str, sim_state: Path | None = None, cgroup_root: str = memlimits.V2_ROOT
) -> tuple[Nvml, Resolver | None]:
    if sim is not None:
        from agent.simgpu.simulated import SimulatedNvml

        backend = SimulatedNvml(sim, node, state_dir=sim_state, cgroup_root=cgroup_root or memlimits.V2_ROOT)
        return backend, backend  # simulated processes carry their pod UID
    from agent.nvml.pynvml_backend import PynvmlBackend

    return PynvmlBackend(), None


def reporter_config(settings: Settings) -> ReporterConfig:
    """The reporter's cadence from the agent's settings (the heartbeat in whole seconds, as published)."""
    return ReporterConfig(
        heartbeat_s=max(1, round(settings.heartbeat_s)),
        min_interval_s=settings.min_write_interval_s,
        memory_threshold_mib=settings.memory_threshold_mib,
    )


def mps_client_lists(settings: Settings) -> ClientLists | None:
    """The node's one listing of the MPS daemon's clients (agent.mpsdaemon.drain), shared by every drain on
    the node: the watchdog's and the runtime handler's stops, so a burst of stops during a watchdog drain
    asks the daemon once per listing, not once per caller. None without MPS."""
    if not settings.mps:
        return None
    return ClientLists(Control(settings.mps_binary, settings.mps_pipe_dir, settings.mps_drain_timeout_s))


def build(
    settings: Settings,
    send: Callable[[Request], dict[str, Any]],
    clock: Callable[[], float],
    mps_clients: ClientLists | None,
) -> Agent:
    """The agent for validated `settings`: NVML or a simulated set, the pid resolver, MPS, the reporter;
    its watchdog drains MPS clients through `mps_clients` (mps_client_lists)."""
    root = host_cgroup2_root(settings.proc_root)
    nvml, sim_resolver = make_nvml(settings.sim, settings.node, settings.sim_state, root)
    resolver: Resolver = sim_resolver or ProcResolver(settings.proc_root)
    fictional: Callable[[], Collection[int]] = frozenset  # pids a simulated GPU set makes up
    if settings.sim is not None:
        from agent.simgpu.simulated import SimulatedNvml

        assert isinstance(nvml, SimulatedNvml)
        resolver, fictional = SimulatedOrHost(nvml, ProcResolver(settings.proc_root)), nvml.owners
    exempt = frozenset(settings.watchdog_exempt_namespaces)
    config = AgentConfig(
        node=settings.node,
        reporter=reporter_config(settings),
        evict_on_violation=settings.evict_on_violation,
        watchdog=Policy(exempt, settings.watchdog_exemption, settings.watchdog_evict_after)
        if settings.watchdog
        else None,
        env_device_selection=toolkit.read(None if settings.sim else settings.toolkit_config),
        mps_compute_mode=ComputeMode.EXCLUSIVE_PROCESS if settings.mps_exclusive_process else None,
        mps_time_slice_gpus=settings.mps_time_slice_gpus,
        isolation=NodeFacts(
            daemon_memory_cap=settings.mps_pinned_mem_limit_mib is not None,
            # Limits are set by the node side (--node-socket); each GPU's driver is judged as it reports.
            per_cgroup_memory=settings.node_socket is not None
            and host_memory_capability(settings, nvml).available,
        ),
    )
    mps = MpsSupervisor(
        MpsConfig(
            enabled=settings.mps,
            binary=settings.mps_binary,
            pipe_dir=settings.mps_pipe_dir,
            default_thread_percentage=settings.mps_thread_percentage,
            default_pinned_mem_limit_mib=settings.mps_pinned_mem_limit_mib,
            prestart_server=settings.mps_prestart_server,
        )
    )
    if config.env_device_selection == toolkit.DISABLED:
        _log.error(
            "NVIDIA container toolkit ignores NVIDIA_VISIBLE_DEVICES for unprivileged containers; "
            "gpupack pods will not get their assigned GPU",
            extra={"key": toolkit.ENV_KEY, "file": str(settings.toolkit_config)},
        )
    # The container-start env check reads the host's processes even with simulated GPUs: the pods are real.
    procs = ProcResolver(settings.proc_root)
    hands = HostProcesses(settings.proc_root, mps_clients, settings.mps_drain_timeout_s)
    return Agent(
        config, nvml=nvml, resolver=resolver, mps=mps, send=send, clock=clock, procs=procs, hands=hands,
        fictional=fictional,
    )  # fmt: skip


def memory_capability(settings: Settings, agent: Agent) -> memlimits.Capability:
    """Whether this node can carry per-cgroup GPU memory limits now (agent.enforce.memlimits.capability)."""
    if not agent.nvml_ready:
        return memlimits.Capability(False, "NVML is not initialised")
    try:
        driver = agent.nvml.driver_version()
    except NvmlError as exc:
        return memlimits.Capability(False, f"NVML: {exc}")
    return memlimits.capability(driver, host_memory_capability(settings, agent.nvml))


def host_memory_capability(settings: Settings, nvml: Nvml) -> memlimits.Capability:
    """What this node offers per-cgroup GPU memory limits whatever its driver: the NVML binding's calls and
    cgroup v2 where the driver reads it (agent.enforce.memlimits.host_capability)."""
    bound = bool(getattr(nvml, "limits_bound", True))  # only the real binding can lack the calls
    root = host_cgroup2_root(settings.proc_root)
    return memlimits.host_capability(bound, root, simulated=settings.sim is not None)


def node_server(
    settings: Settings,
    kube: KubeApi,
    agent: Agent,
    mps_clients: ClientLists | None,
) -> NodeServer | None:
    """The RuntimeClass handler's answerer, where --node-socket asks for one (docs/node-side.md): it answers a
    create from its watch of the node's pods (agent.runtime.nodepods) and reads the apiserver through `kube`
    where that grants nothing; its stops drain MPS clients through `mps_clients`, the same listing as the
    watchdog's (mps_client_lists)."""
    if settings.node_socket is None:
        return None
    mps_not_ready = mpsprep.readiness(settings.mps_pipe_dir, mpsprep.boot_id())  # a reboot restarts us too
    pipe_dirs = PipeDirs(settings.mps_pipe_dir)
    agent.mps.on_new_daemon(pipe_dirs.refresh)  # a new daemon's socket: the pods' links follow at once
    namespaces = (
        Namespaces(settings.mps_binary, settings.mps_pipe_dir)
        if settings.mps and settings.mps_protocol == 3
        else None
    )
    limiter = Limiter(
        lambda: agent.nvml if agent.nvml_ready else None, settings.node_socket.parent / "limits", namespaces
    )
    mounts: tuple[nodeside.Mount, ...] = ()
    if settings.sim_allocator is not None:
        mounts = (nodeside.Mount(str(settings.sim_allocator.parent), SIM_GPU_DIR),)
    pods = nodepods.NodePods()
    return NodeServer(
        settings.node_socket,
        settings.node,
        pipe_dirs,
        kube.send,
        mps_not_ready=mps_not_ready,
        daemon_not_ready=agent.mps.not_ready if settings.mps else (lambda: ""),
        limiter=limiter,
        capability=lambda: memory_capability(settings, agent),
        namespaces=namespaces,
        gpu_mounts=mounts,
        mps_clients=mps_clients,
        drain_timeout_s=settings.mps_drain_timeout_s,
        watched=pods.of,
        pod_watch=nodepods.watch(kube, settings.node, pods),
    )


def sim_allocator(settings: Settings, agent: Agent) -> Allocator | None:
    """The simulated GPUs' allocator (agent.simgpu.simalloc), where --sim-allocator asks for one."""
    if settings.sim_allocator is None or settings.sim is None:
        return None
    from agent.simgpu.simalloc import Allocator, mps_view
    from agent.simgpu.simulated import SimulatedNvml

    assert isinstance(agent.nvml, SimulatedNvml)
    if not agent.nvml_ready:
        agent.nvml.init()
    control = Control(settings.mps_binary, settings.mps_pipe_dir) if settings.mps else None
    return Allocator(
        agent.nvml, settings.sim_allocator, settings.proc_root, agent.nvml.cgroup_root,
        mps=lambda: mps_view(control),
    )  # fmt: skip


class Runner:
    """Runs `agent.step()` every `interval_s` until stopped, in the caller's thread or its own."""

    def __init__(self, agent: Agent, interval_s: float, on_fatal: Callable[[], None] = lambda: None) -> None:
        self.agent = agent
        self.interval_s = interval_s
        self.on_fatal = on_fatal  # called when the loop ends on a configuration error
        self.exit_code = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> int:
        """Loop until `stop()`; 2 when the simulated GPU file is invalid, else 0."""
        while not self._stop.is_set():
            began = time.perf_counter()
            try:
                self.agent.step()
            except BackendConfigError as exc:  # e.g. an invalid simulated GPU file: a configuration error
                _log.error("GPU backend configuration invalid", extra={"error": str(exc)})
                self.exit_code = 2
                self.on_fatal()
                return 2
            except Exception:
                # Keep serving: a bug in one cycle must not stop the heartbeat of the next. If every
                # cycle fails, /healthz goes stale and the liveness probe restarts the container.
                _log.exception("agent cycle failed")
            metrics.CYCLE_SECONDS.observe(time.perf_counter() - began)
            self._stop.wait(self.interval_s)
        return 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="agent-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def create_app(settings: Settings, agent: Agent, runner: Runner | None = None) -> FastAPI:
    """/healthz (200 while cycles run) and /metrics (the agent's series); the lifespan runs `runner`."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if runner is not None:
            runner.start()
        try:
            yield
        finally:
            if runner is not None:
                runner.stop()

    app = FastAPI(title="gpupack agent", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    registry = metrics.registry()
    metrics.HEARTBEAT_AGE_SECONDS.set_function(agent.heartbeat_age)
    app.state.metrics_registry = registry

    @app.get("/healthz", summary="Liveness: the last agent cycle is recent")
    def healthz() -> JSONResponse:
        age = None if agent.last_step is None else agent.clock() - agent.last_step
        ok = age is not None and age <= settings.max_step_age_s
        body = {
            "ok": ok,
            "last_step_age_s": age,
            "nvml": agent.nvml_ready,
            "mps": agent.mps.state.value,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    def metrics_route() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
