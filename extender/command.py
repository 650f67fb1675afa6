"""`gpupack extender serve`: run the scheduler extender."""

from __future__ import annotations

import argparse
import sys

from app.placement import DEFAULT_POLICY, registry
from app.settings import from_args
from extender.config import FLAGS, Settings
from extender.workloads import LEARNED, SOURCES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("extender", help="the kube-scheduler extender")
    verbs = p.add_subparsers(dest="extender_command", metavar="VERB", required=True)
    s = verbs.add_parser(
        "serve", help="serve filter/prioritize/bind for kube-scheduler (HTTPS, client certificate required)"
    )
    s.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    s.add_argument("--host", default="0.0.0.0", help="listen address of both ports (default 0.0.0.0)")
    s.add_argument(
        "--port",
        type=int,
        default=8888,
        help="HTTPS port for kube-scheduler: filter, prioritize, bind, state, explain (default 8888)",
    )
    s.add_argument(
        "--ops-port",
        type=int,
        default=8889,
        help="plain HTTP port with only healthz, readyz, metrics, for probes and Prometheus (default 8889)",
    )
    s.add_argument("--tls-cert", help="PEM serving certificate of --port (reloaded when it changes)")
    s.add_argument("--tls-key", help="PEM private key of --tls-cert")
    s.add_argument(
        "--client-ca",
        help="PEM CA bundle: a caller of --port must present a client certificate signed by it "
        "(kube-scheduler's extender tlsConfig certFile/keyFile)",
    )
    s.add_argument(
        "--cert-check-interval", type=float, default=1.0, help="seconds between checks of the TLS files"
    )
    s.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        help=f"placement policy: {', '.join(registry.names())} (default {DEFAULT_POLICY})",
    )
    s.add_argument(
        "--workload",
        choices=SOURCES,
        default=LEARNED,
        help="target workload of the policy: learned from the cluster's gpupack pods and fleet, or the "
        "built-in distribution (default learned)",
    )
    s.add_argument(
        "--lease-namespace", default="gpupack-system", help="namespace of the leader-election Lease"
    )
    s.add_argument("--lease-name", default="gpupack-extender", help="name of the leader-election Lease")
    s.add_argument("--identity", help="leader-election identity (default: $POD_NAME, else host-pid)")
    s.add_argument("--lease-duration", type=int, default=15, help="lease duration, seconds (default 15)")
    s.add_argument(
        "--heartbeat-timeout",
        type=float,
        help="treat a GPUNode whose heartbeat is older than this many seconds as unschedulable "
        "(default: the agent's own status.staleAfterSeconds)",
    )
    s.add_argument(
        "--watch-timeout",
        type=int,
        default=45,
        help="server-side timeout of each watch call, seconds (default 45)",
    )
    s.add_argument(
        "--live-within",
        type=float,
        default=60.0,
        help="report not ready when the cluster view has not been proven live for this many seconds "
        "(default 60; must exceed --watch-timeout)",
    )
    s.add_argument(
        "--no-decide-in-filter",
        dest="decide_in_filter",
        action="store_false",
        help="let every fitting node pass filter and only rank them in prioritize",
    )
    s.add_argument("--log-level", default="info")
    s.set_defaults(func=serve)


def settings_from(args: argparse.Namespace) -> Settings:
    duration = args.lease_duration
    # The lease's timing follows its duration in client-go's proportions (15 s: renew 10 s, retry 2 s).
    return from_args(
        Settings, args, FLAGS, renew_deadline_s=duration * 2 / 3, retry_period_s=max(0.2, duration / 7.5)
    )


def serve(args: argparse.Namespace) -> int:
    from extender.main import serve as run

    settings = settings_from(args)
    errors = settings.validate() + settings.serving_errors()
    if errors:
        for e in errors:
            print(f"gpupack extender serve: {e.as_flag()}", file=sys.stderr)
        return 2
    run(settings)
    return 0
