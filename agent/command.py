"""`gpupack agent run` (flags → Settings → the agent, its cycle, /metrics + /healthz); `agent prepare-mps`."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from agent.settings import FLAGS, Settings
from app.core import log
from app.service.settings import add_flag, default_of, from_args

if TYPE_CHECKING:  # the informer module is imported where the agent runs (agent.main), not for every command
    from app.kube.informers import KubeApi

_log = log.get("gpupack.agent")

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def duration(raw: str) -> float:
    """ "30s", "500ms", "2m", "1h" or bare seconds, as seconds."""
    match = _DURATION.match(raw.strip())
    if not match or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{raw!r}: must be a positive duration like 30s, 500ms, 2m")
    return float(match[1]) * _UNIT_S[match[2]]


def duration_or_zero(raw: str) -> float:
    """A duration as `duration` reads it, or 0 ("0", "0s": the thing it bounds is off)."""
    match = _DURATION.match(raw.strip())
    if match and float(match[1]) == 0:
        return 0.0
    try:
        return duration(raw)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{raw!r}: must be 0 (off) or a positive duration like 5s, 500ms"
        ) from None


def gpu_indexes(raw: str) -> tuple[int, ...]:
    """ "1,3" (or "none", or "") as GPU indexes."""
    parts = [p.strip() for p in raw.split(",") if p.strip() and p.strip() != "none"]
    if not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{raw!r}: must be GPU indexes separated by commas, like 1,3")
    return tuple(sorted({int(p) for p in parts}))


def names_list(raw: str) -> tuple[str, ...]:
    """ "gpu-operator,monitoring" (or "none", or "") as names."""
    return tuple(p.strip() for p in raw.split(",") if p.strip() and p.strip() != "none")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent = sub.add_parser("agent", help="the node agent (DaemonSet on GPU nodes)")
    agent_sub = agent.add_subparsers(dest="agent_command", metavar="COMMAND", required=True)
    run = agent_sub.add_parser("run", help="report this node's GPUs, run MPS, verify containers")
    flag = partial(add_flag, run, Settings, FLAGS)  # default and help from the Settings field
    flag("node", default=os.environ.get("NODE_NAME", ""))
    flag("kubeconfig")
    flag("sim", type=Path)
    flag("sim_state", type=Path)
    flag("heartbeat_s", type=duration)
    flag("interval_s", type=duration)
    flag("min_write_interval_s", type=duration)
    flag("memory_threshold_mib", type=int)
    flag("host")
    flag("port", type=int)
    flag("proc_root", type=Path)
    flag("toolkit_config", type=Path)
    flag("evict_on_violation", action="store_true")
    flag("watchdog", dest="watchdog", action="store_false")
    flag("watchdog_evict_after", type=int)
    flag("watchdog_exempt_namespaces", type=names_list)
    flag("watchdog_exempt_label")
    flag("mps", dest="mps", action="store_false")
    flag("mps_binary")
    flag("mps_pipe_dir", type=Path)
    flag("mps_exclusive_process", action="store_true")
    flag("mps_time_slice_gpus", type=gpu_indexes)
    flag("mps_thread_percentage", type=int)
    flag("mps_pinned_mem_limit_mib", type=int)
    flag("mps_protocol", type=int)
    flag("mps_drain_timeout_s", type=duration_or_zero)
    flag("mps_prestart_server", dest="mps_prestart_server", action="store_false")
    flag("sim_allocator", type=Path)
    flag("node_socket", type=Path)
    flag("log_level")
    run.set_defaults(func=run_command)
    prep = agent_sub.add_parser(
        "prepare-mps",
        help="put idle MPS GPUs in their compute mode, write the ready record (the MPS daemon pod's init)",
    )
    prep_flag = partial(add_flag, prep, Settings, FLAGS)  # the same fields as `run`'s
    prep_flag("sim", type=Path)
    prep_flag("sim_state", type=Path)
    prep_flag("node", default=os.environ.get("NODE_NAME", ""))
    prep_flag("mps_time_slice_gpus", type=gpu_indexes)
    prep.add_argument(
        "--pipe-dir",
        type=Path,
        default=default_of(Settings, "mps_pipe_dir"),
        help="the MPS daemon's pipe directory",
    )
    prep.add_argument(
        "--compute-mode",
        choices=("exclusive-process", "default", "keep"),
        default="exclusive-process",
        help="mode idle MPS GPUs are put in; keep: leave every mode as it is (default: exclusive-process)",
    )
    prep.set_defaults(func=prepare_command)

    handler = agent_sub.add_parser(
        "handler", help="install gpupack's RuntimeClass handler on this node; remove it on uninstall"
    )
    handler.add_argument("--source", type=Path, required=True, help="the gpupack-runc binary to install")
    handler.add_argument(
        "--install-dir", type=Path, required=True, help="host dir of containerd's BinaryName"
    )
    handler.add_argument("--runtime", default="runc", help="the real runtime the handler runs")
    handler.add_argument("--socket", type=Path, required=True, help="the agent's --node-socket (host path)")
    handler.add_argument("--state-dir", type=Path, required=True, help="host dir of the containers' records")
    handler.add_argument("--daemonset", required=True, help="this pod's DaemonSet (gone: an uninstall)")
    handler.add_argument("--namespace", required=True, help="the DaemonSet's namespace")
    handler.add_argument(
        "--guard",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also install the guard as the node's default runtime (no GPU for a container gpupack did not "
        "allocate one to); --no-guard restores the node's previous default runtime",
    )
    handler.add_argument(
        "--exempt-namespace",
        action="append",
        default=[],
        help="the guard leaves this namespace's pods as they are",
    )
    handler.add_argument(
        "--exempt-pod",
        action="append",
        default=[],
        help="<namespace>/<pod name prefix>: the guard leaves those pods as they are",
    )
    handler.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then ~/.kube/config)"
    )
    handler.add_argument("--log-level", default="info")
    handler.set_defaults(func=handler_command)


def settings_from(args: argparse.Namespace) -> Settings:
    return from_args(Settings, args, FLAGS)


def run_command(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    log.setup(settings.log_level)
    errors = settings.validate()
    if errors:
        for e in errors:
            print(f"gpupack agent run: {e.as_flag()}", file=sys.stderr)
        return 2
    from app.kube.client import Kube  # here: the Kubernetes client costs every other gpupack command 0.2 s

    try:
        kube = Kube.connect(settings.kubeconfig)
    except Exception as exc:  # the client's config errors are its own types; agent/ must not import them
        _log.error(
            "no Kubernetes configuration", extra={"kubeconfig": settings.kubeconfig, "error": str(exc)}
        )
        return 2
    try:
        return _run(settings, kube)
    finally:
        kube.close()


def _run(settings: Settings, kube: KubeApi) -> int:
    import uvicorn

    from agent.main import Runner, build, create_app, mps_client_lists, node_server, sim_allocator

    mps_clients = mps_client_lists(settings)  # one per node: the watchdog's drains and the stops' share it
    agent = build(settings, kube.send, time.time, mps_clients)
    node_side = node_server(settings, kube, agent, mps_clients)
    if node_side is not None:
        node_side.start()
    allocator = sim_allocator(settings, agent)
    if allocator is not None:
        allocator.start()
    _log.info(
        "agent started",
        extra={"node": settings.node, "sim": str(settings.sim or ""), "heartbeat_s": settings.heartbeat_s},
    )
    try:
        if not settings.port:  # no server: the cycle runs here until SIGTERM/SIGINT
            runner = Runner(agent, settings.interval_s)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: runner.stop())
            return runner.run()
        server: uvicorn.Server | None = None

        def fatal() -> None:
            if server is not None:
                server.should_exit = True

        runner = Runner(agent, settings.interval_s, on_fatal=fatal)
        config = uvicorn.Config(
            create_app(settings, agent, runner),
            host=settings.host,
            port=settings.port,
            access_log=False,  # scrapes every few seconds would drown the agent's own log lines
            log_config=None,  # keep log.setup()'s JSON handler
        )
        server = uvicorn.Server(config)
        server.run()
        return runner.exit_code
    finally:
        if allocator is not None:
            allocator.stop()
        if node_side is not None:
            node_side.stop()
        # Nothing of the node's MPS is stopped: the daemon runs in its own pod, and its servers and their
        # clients outlive this process (agent.mpsdaemon.mps).
        _log.info("agent stopped", extra={"node": settings.node})


def handler_command(args: argparse.Namespace) -> int:
    """Install, wait for SIGTERM, then remove the handler if the release is gone
    (agent.runtime.handlerinstall)."""
    import threading

    from agent.runtime import handlerinstall as hi

    log.setup(args.log_level)
    bad = [f"--{k.replace('_', '-')}={v}: must be an absolute path" for k, v in
           (("install_dir", args.install_dir), ("socket", args.socket), ("state_dir", args.state_dir))
           if not v.is_absolute()]  # fmt: skip
    if not args.source.is_file():
        bad.append(f"--source={args.source}: no such file")
    exempt_namespaces, exempt_pods = tuple(args.exempt_namespace), tuple(args.exempt_pod)
    bad += hi.exemption_problems(exempt_namespaces, exempt_pods)
    if bad:
        for line in bad:
            print(f"gpupack agent handler: {line}", file=sys.stderr)
        return 2
    files = hi.HandlerFiles(args.install_dir, args.runtime, args.socket, args.state_dir)
    guard = hi.GuardFiles(args.install_dir, args.state_dir, exempt_namespaces, exempt_pods)
    hi.install(files, args.source)
    if args.guard:
        hi.install_guard(guard, args.source)
    else:
        hi.uninstall_guard(guard)  # the chart turned it off: the node's previous default runtime again
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    from app.kube.client import Kube

    try:
        kube = Kube.connect(args.kubeconfig)
    except Exception as exc:  # no configuration at all: the ServiceAccount is gone with the release
        _log.info("no Kubernetes configuration left; treating as an uninstall", extra={"error": str(exc)})
        hi.uninstall_guard(guard)
        hi.uninstall(files)
        return 0
    try:
        if hi.release_gone(kube.send, args.namespace, args.daemonset):
            hi.uninstall_guard(guard)
            hi.uninstall(files)
        else:
            _log.info("rollout: the runtime handler stays for the next agent pod")
    finally:
        kube.close()
    return 0


def prepare_command(args: argparse.Namespace) -> int:
    """`gpupack agent prepare-mps`: 0 once every GPU was looked at (a busy one stays, and says so);
    1 when NVML cannot be used at all (the init container is retried by the kubelet)."""
    from agent.main import make_nvml
    from agent.mpsdaemon import mpsprep
    from agent.nvml.base import ComputeMode, NvmlError

    log.setup("info")
    want = {"exclusive-process": ComputeMode.EXCLUSIVE_PROCESS, "default": ComputeMode.DEFAULT}.get(
        args.compute_mode
    )
    nvml, _ = make_nvml(args.sim, args.node, args.sim_state)
    try:
        nvml.init()
        modes = mpsprep.apply(nvml, want, args.mps_time_slice_gpus)
    except NvmlError as exc:
        print(f"gpupack agent prepare-mps: NVML: {exc}", file=sys.stderr)
        return 1
    for m in modes:
        state = (m.mode.value if m.mode else "unknown") + (" (switched)" if m.switched else "")
        print(f"GPU {m.index} {m.uuid}: {state}" + (f"; {m.reason}" if m.reason else ""))
    path = mpsprep.write_ready(args.pipe_dir, modes, mpsprep.boot_id())
    print(f"ready record: {path}")
    return 0
