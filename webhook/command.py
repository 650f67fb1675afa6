"""`gpupack webhook serve` (the HTTPS admission server) and `gpupack certs` (its CA and serving cert)."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from functools import partial
from pathlib import Path
from typing import Any

from app.core import log
from app.service import certs
from app.service.settings import add_flag, default_of, from_args
from webhook.settings import FLAGS, Settings

# Idle keep-alive connections are kept longer than the apiserver keeps them (client-go's transport closes
# idle ones after 90 s, net/http's default): the apiserver always closes first, so no POST is ever sent on a
# connection we are closing, and a pause of a few seconds between pods costs no new TLS handshake.
KEEP_ALIVE_S = 120


def register(sub: Any) -> None:  # argparse's _SubParsersAction is private, hence Any
    webhook = sub.add_parser("webhook", help="the mutating admission webhook")
    webhook_sub = webhook.add_subparsers(dest="webhook_command", metavar="COMMAND", required=True)
    serve = webhook_sub.add_parser("serve", help="serve /mutate, /healthz, /readyz, /metrics over HTTPS")
    flag = partial(add_flag, serve, Settings, FLAGS)  # default and help from the Settings field
    flag("cert_file", required=True)
    flag("key_file", required=True)
    flag("host")
    flag("port", type=int)
    flag("scheduler_name")
    flag("mps_pipe_host_dir")
    flag("runtime_class")
    flag("hami_takeover", action="store_true")
    flag("cert_check_interval_s", type=float)
    flag("read_gpunodes", action="store_true")
    flag("kubeconfig")
    flag("quota_gpu_memory_mib", type=int)
    flag("workers", type=int)
    flag("log_level")
    serve.set_defaults(func=_serve)

    gen = sub.add_parser("certs", help="make a CA and a webhook serving certificate; print the caBundle")
    gen.add_argument("--out", required=True, type=Path, help="directory for ca.crt, ca.key, tls.crt, tls.key")
    gen.add_argument("--dns", action="append", default=[], help="extra DNS SAN (repeatable)")
    gen.add_argument(
        "--ip", action="append", default=[], type=_ip, help="IP SAN (repeatable), e.g. 127.0.0.1"
    )
    gen.add_argument("--days", type=_days, default=365, help="serving certificate lifetime")
    gen.add_argument("--service", default="gpupack-webhook", help="Service name, for the in-cluster DNS SANs")
    gen.add_argument(
        "--namespace", default="gpupack-system", help="Service namespace, for the in-cluster DNS SANs"
    )
    gen.add_argument(
        "--new-ca", action="store_true", help="replace an existing CA in --out (changes the caBundle)"
    )
    gen.set_defaults(func=_certs)


def settings_from(args: argparse.Namespace) -> Settings:
    # An empty --scheduler-name or --mps-pipe-host-dir (an unset chart value) means the default.
    return from_args(
        Settings,
        args,
        FLAGS,
        scheduler_name=args.scheduler_name or None,
        runtime_class=args.runtime_class or None,
        kubeconfig=args.kubeconfig or None,
        mps_pipe_host_dir=args.mps_pipe_host_dir or default_of(Settings, "mps_pipe_host_dir"),
    )


def _serve(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    errors = settings.validate()
    if errors:
        for e in errors:
            print(f"gpupack webhook serve: {e.as_flag()}", file=sys.stderr)
        return 2
    log.setup(settings.log_level)
    if settings.workers == 1:
        _run_server(settings)
        return 0
    from webhook import workers

    with workers.metrics_dir():
        import webhook.main  # noqa: F401  # before the fork: the workers share its pages; metrics multiprocess

        sock = workers.listen(settings.host, settings.port)
        return workers.run(settings.workers, lambda: _run_server(settings, sock))


def _run_server(settings: Settings, sock: socket.socket | None = None) -> None:
    """One uvicorn server on uvloop + httptools (HTTPS), on `sock` when a parent bound it for several."""
    import uvicorn

    from app.service.tls import ReloadingContext
    from webhook import fleet
    from webhook.main import create_app
    from webhook.metrics import count_cert_reload

    assert settings.cert_file and settings.key_file  # `serve` requires --cert and --key
    tls = ReloadingContext(
        settings.cert_file,
        settings.key_file,
        check_interval=settings.cert_check_interval_s,
        on_reload=count_cert_reload,
    )
    # Each worker reads the GPUNodes itself (after the fork: a thread does not survive one).
    view = fleet.FleetView(settings.quota_gpu_memory_mib)
    ready = fleet.watch(settings.kubeconfig, view).synced.is_set if settings.read_gpunodes else None
    config = uvicorn.Config(
        create_app(settings, ready, lambda: view.fleet),
        host=settings.host,
        port=settings.port,
        ssl_context_factory=lambda _config, _default: tls.context,
        access_log=False,  # one structured line per review is logged by the app itself
        log_config=None,  # keep log.setup()'s JSON handler
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_S,
        loop="uvloop",
        http="httptools",
    )
    uvicorn.Server(config).run(sockets=[sock] if sock is not None else None)


def _ip(raw: str) -> str:
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ip={raw!r}: must be an IPv4 or IPv6 address") from None


def _days(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 3650):
        raise argparse.ArgumentTypeError(f"--days={raw!r}: must be a whole number of days from 1 to 3650")
    return int(raw)


def _certs(args: argparse.Namespace) -> int:
    dns = certs.service_dns_names(args.service, args.namespace) + list(args.dns)
    bundle = certs.write_bundle(args.out, dns, list(args.ip), days=args.days, fresh_ca=args.new_ca)
    print(
        f"wrote {args.out}/{{ca.crt,ca.key,tls.crt,tls.key}}; SANs: {', '.join(dns + list(args.ip))}",
        file=sys.stderr,
    )
    print(bundle)  # stdout carries only the caBundle, so `$(gpupack certs ...)` works
    return 0
