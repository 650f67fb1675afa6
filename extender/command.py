"""`gpupack extender serve`: run the scheduler extender."""

from __future__ import annotations

import argparse
import sys
from functools import partial

from app.service.settings import add_flag, from_args
from extender.config import FLAGS, Settings
from extender.workloads import SOURCES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("extender", help="the kube-scheduler extender")
    verbs = p.add_subparsers(dest="extender_command", metavar="VERB", required=True)
    s = verbs.add_parser(
        "serve", help="serve filter/prioritize/bind for kube-scheduler (HTTPS, client certificate required)"
    )
    flag = partial(add_flag, s, Settings, FLAGS)  # default and help from the Settings field
    flag("kubeconfig")
    flag("host")
    flag("port", type=int)
    flag("ops_port", type=int)
    flag("tls_cert_file")
    flag("tls_key_file")
    flag("client_ca_file")
    flag("cert_check_interval_s", type=float)
    flag("policy")
    flag("workload", choices=SOURCES)
    flag("lease_namespace")
    flag("lease_name")
    flag("identity")
    flag("lease_duration_s", type=int)
    flag("heartbeat_timeout_s", type=float)
    flag("watch_timeout_s", type=int)
    flag("live_within_s", type=float)
    flag("decide_in_filter", dest="decide_in_filter", action="store_false")
    flag("autoscale_pools", dest="autoscale_pools", action="append", metavar="MODEL:GPUS")
    flag("autoscale_interval_s", type=float)
    flag("autoscale_grace_s", type=float)
    flag("autoscale_resource")
    flag("log_level")
    s.set_defaults(func=serve)


def settings_from(args: argparse.Namespace) -> Settings:
    duration = args.lease_duration
    # The lease's timing follows its duration in client-go's proportions (15 s: renew 10 s, retry 2 s).
    pools = tuple(args.autoscale_pools) if args.autoscale_pools else None
    return from_args(
        Settings,
        args,
        FLAGS,
        renew_deadline_s=duration * 2 / 3,
        retry_period_s=max(0.2, duration / 7.5),
        autoscale_pools=pools,
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
