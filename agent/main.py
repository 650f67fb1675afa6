"""`gpupack agent run`: wire NVML, MPS, the reporter and the /metrics + /healthz server, then loop."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from agent import toolkit
from agent.cgroup import ProcResolver
from agent.loop import Agent, AgentConfig, Resolver
from agent.mps import MpsConfig, MpsSupervisor
from agent.nvml.base import Nvml
from agent.nvml.simfile import SimFileError
from agent.reporter import ReporterConfig
from app import log, names
from app import metrics as m
from app.kube.client import Kube

_log = log.get("gpupack.agent")

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def duration(raw: str) -> float:
    """ "30s", "500ms", "2m", "1h" or bare seconds, as seconds."""
    match = _DURATION.match(raw.strip())
    if not match or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{raw!r}: must be a positive duration like 30s, 500ms, 2m")
    return float(match[1]) * _UNIT_S[match[2]]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent = sub.add_parser("agent", help="the node agent (DaemonSet on GPU nodes)")
    agent_sub = agent.add_subparsers(dest="agent_command", metavar="COMMAND", required=True)
    run = agent_sub.add_parser("run", help="report this node's GPUs, run MPS, verify containers")
    run.add_argument(
        "--node", default=os.environ.get("NODE_NAME", ""), help="node name (default: $NODE_NAME)"
    )
    run.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then ~/.kube/config)"
    )
    run.add_argument("--sim", type=Path, default=None, help="simulated GPU set file instead of NVML")
    run.add_argument("--heartbeat", type=duration, default=30.0, help="status heartbeat (default 30s)")
    run.add_argument("--interval", type=duration, default=5.0, help="NVML sampling interval (default 5s)")
    run.add_argument(
        "--min-write-interval", type=duration, default=5.0, help="least time between status writes"
    )
    run.add_argument(
        "--memory-threshold-mib", type=int, default=256, help="memory change that triggers a write"
    )
    run.add_argument("--host", default="0.0.0.0", help="address for /metrics and /healthz")
    run.add_argument("--port", type=int, default=9400, help="port for /metrics and /healthz (0: none)")
    run.add_argument("--proc-root", type=Path, default=Path("/proc"), help="the host's /proc, for pid → pod")
    run.add_argument("--toolkit-config", type=Path, default=Path("/etc/nvidia-container-runtime/config.toml"))
    run.add_argument(
        "--evict-on-violation", action="store_true", help="evict pods off their GPU or over memory"
    )
    run.add_argument("--no-mps", dest="mps", action="store_false", help="do not run the MPS control daemon")
    run.add_argument("--mps-binary", default="nvidia-cuda-mps-control")
    run.add_argument("--mps-pipe-dir", type=Path, default=Path(names.MPS_PIPE_DIRECTORY))
    run.add_argument("--mps-log-dir", type=Path, default=Path("/var/log/nvidia-mps"))
    run.add_argument("--mps-thread-percentage", type=int, default=100, help="daemon default active thread %%")
    run.add_argument("--mps-pinned-mem-limit-mib", type=int, default=None, help="daemon default per device")
    run.add_argument("--log-level", default="info")
    run.set_defaults(func=run_command)


def make_nvml(sim: Path | None, node: str) -> tuple[Nvml, Resolver | None]:
    if sim is not None:
        from agent.nvml.simulated import SimulatedNvml

        backend = SimulatedNvml(sim, node)
        return backend, backend  # simulated processes carry their pod UID
    from agent.nvml.pynvml_backend import PynvmlBackend

    return PynvmlBackend(), None


def run_command(args: argparse.Namespace) -> int:
    log.setup(args.log_level)
    if not args.node:
        _log.error("no node name: pass --node or set NODE_NAME")
        return 2
    if args.sim is not None and not args.sim.is_file():
        _log.error("simulated GPU file not found", extra={"path": str(args.sim)})
        return 2
    nvml, sim_resolver = make_nvml(args.sim, args.node)
    resolver: Resolver = sim_resolver or ProcResolver(args.proc_root)
    try:
        kube = Kube.connect(args.kubeconfig)
    except Exception as exc:  # the client's config errors are its own types; agent/ must not import them
        _log.error("no Kubernetes configuration", extra={"kubeconfig": args.kubeconfig, "error": str(exc)})
        return 2
    config = AgentConfig(
        node=args.node,
        reporter=_reporter_config(args),
        evict_on_violation=args.evict_on_violation,
        env_device_selection=toolkit.read(None if args.sim else args.toolkit_config),
    )
    mps = MpsSupervisor(
        MpsConfig(
            enabled=args.mps,
            binary=args.mps_binary,
            pipe_dir=args.mps_pipe_dir,
            log_dir=args.mps_log_dir,
            default_thread_percentage=args.mps_thread_percentage,
            default_pinned_mem_limit_mib=args.mps_pinned_mem_limit_mib,
        )
    )
    agent = Agent(config, nvml=nvml, resolver=resolver, mps=mps, send=kube.send, clock=time.time)
    if config.env_device_selection == toolkit.DISABLED:
        _log.error(
            "NVIDIA container toolkit ignores NVIDIA_VISIBLE_DEVICES for unprivileged containers; "
            "gpupack pods will not get their assigned GPU",
            extra={"key": toolkit.ENV_KEY, "file": str(args.toolkit_config)},
        )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    m.AGENT_HEARTBEAT_AGE_SECONDS.set_function(agent.heartbeat_age)
    server = serve(args.host, args.port, agent, max(3 * args.interval, 30.0)) if args.port else None
    _log.info(
        "agent started", extra={"node": args.node, "sim": str(args.sim or ""), "heartbeat_s": args.heartbeat}
    )
    try:
        while not stop.is_set():
            try:
                agent.step()
            except SimFileError as exc:  # an invalid file at start is a configuration error
                _log.error("simulated GPU file invalid", extra={"error": str(exc)})
                return 2
            except Exception:
                # Keep serving: a bug in one cycle must not stop the heartbeat of the next. If every
                # cycle fails, /healthz goes stale and the liveness probe restarts the container.
                _log.exception("agent cycle failed")
            stop.wait(args.interval)
    finally:
        mps.stop()
        if server is not None:
            server.shutdown()
        kube.close()
        _log.info("agent stopped", extra={"node": args.node})
    return 0


def _reporter_config(args: argparse.Namespace) -> ReporterConfig:
    return ReporterConfig(
        heartbeat_s=max(1, round(args.heartbeat)),
        min_interval_s=args.min_write_interval,
        memory_threshold_mib=args.memory_threshold_mib,
    )


def serve(host: str, port: int, agent: Agent, max_step_age_s: float) -> ThreadingHTTPServer:
    """/metrics (Prometheus text) and /healthz (200 while the loop runs) on a background thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._reply(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                age = None if agent.last_step is None else time.time() - agent.last_step
                ok = age is not None and age <= max_step_age_s
                body = {
                    "ok": ok,
                    "last_step_age_s": age,
                    "nvml": agent.nvml_ready,
                    "mps": agent.mps.state.value,
                }
                self._reply(200 if ok else 503, json.dumps(body).encode(), "application/json")
            else:
                self._reply(404, b"not found\n", "text/plain")

        def _reply(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes every few seconds would drown the agent's own log lines

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="agent-http", daemon=True).start()
    return server
