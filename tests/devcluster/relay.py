"""A TCP relay for a dev cluster with a real node: what kube-proxy would do for the two paths it needs.

The dev cluster runs no kube-proxy and no DNS, and its apiserver listens on 127.0.0.1 only. So:

* pods on the real node's bridge reach the apiserver at the node IP: `--listen NODE_IP:PORT --to
  127.0.0.1:PORT` (the apiserver's certificate names the node IP; KUBERNETES_SERVICE_HOST/PORT point there);
* kube-scheduler on the host reaches the extender Service: `--listen 127.0.0.1:PORT --service NS/NAME:PORT`
  relays each connection to a ready endpoint of that Service (only the extender leader is Ready), looked
  up in its EndpointSlices when the connection arrives, as a Service routes.

Bytes are relayed as they are (TLS end to end), by faults.TcpProxy. Run as `python -m tests.devcluster.relay`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.core import log
from app.core.errors import KubeError
from app.kube.calls import Request
from app.kube.client import Kube

from .faults import TcpProxy, Upstream, fixed

_log = log.get("gpupack.devcluster.relay")


def host_port(text: str) -> Upstream:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: must be HOST:PORT with a port in 1..65535")
    return host, int(port)


def service_ref(text: str) -> tuple[str, str, int]:
    ns, sep, rest = text.partition("/")
    name, sep2, port = rest.rpartition(":")
    if not (sep and sep2 and ns and name and port.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: must be NAMESPACE/NAME:PORT")
    return ns, name, int(port)


def ready_endpoint(
    service: Mapping[str, Any], slices: Sequence[Mapping[str, Any]], port: int
) -> Upstream | None:
    """The first ready endpoint of `service` for its port `port` (pure): (address, target port)."""
    names = [p.get("name", "") for p in service.get("spec", {}).get("ports", []) if p.get("port") == port]
    if not names:
        return None
    for s in slices:
        target = next((p.get("port") for p in s.get("ports") or [] if p.get("name", "") == names[0]), None)
        if target is None:
            continue
        for ep in s.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready") and ep.get("addresses"):
                return str(ep["addresses"][0]), int(target)
    return None


def service_picker(kube: Kube, namespace: str, name: str, port: int) -> Callable[[], Upstream | None]:
    """A TcpProxy pick function: a ready endpoint of the Service, read when each connection arrives."""

    def pick() -> Upstream | None:
        try:
            service = kube.send(Request("GET", f"/api/v1/namespaces/{namespace}/services/{name}"))
            slices = kube.send(
                Request(
                    "GET",
                    f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
                    query={"labelSelector": f"kubernetes.io/service-name={name}"},
                )
            )
        except KubeError as exc:
            _log.warning("service lookup failed", extra={"service": f"{namespace}/{name}", "error": str(exc)})
            return None
        return ready_endpoint(service, slices.get("items", []), port)

    return pick


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.devcluster.relay", description=__doc__)
    parser.add_argument("--listen", type=host_port, required=True, help="HOST:PORT to listen on")
    to = parser.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", type=host_port, help="HOST:PORT to relay every connection to")
    to.add_argument("--service", type=service_ref, help="NAMESPACE/NAME:PORT: a ready endpoint of it")
    parser.add_argument("--kubeconfig", help="for --service: how to read the Service and its EndpointSlices")
    args = parser.parse_args(argv)
    if args.service is not None:
        if not args.kubeconfig:
            parser.error("--service needs --kubeconfig")
        pick = service_picker(Kube.connect(args.kubeconfig), *args.service)
    else:
        pick = fixed(*args.to)
    host, port = args.listen
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with TcpProxy(pick, port=port, host=host, name="relay").start():
        print(f"relay: listening on {host}:{port}", file=sys.stderr, flush=True)
        while not done.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
