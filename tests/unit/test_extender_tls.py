"""The extender's two listeners on loopback: mutual TLS for kube-scheduler's verbs, plain HTTP for probes.

A caller without a client certificate, or with one from another CA, is refused during the TLS handshake,
before any HTTP is read; the ops port serves only /healthz, /readyz and /metrics.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from app.core.placement import registry
from app.kube.assume import AssumeCache
from app.kube.cache import ClusterCache
from app.service import certs
from extender.binder import Binder
from extender.config import Settings
from extender.main import create_app, run, servers
from tests.devcluster.ports import free_ports
from tests.static_runtime import StaticRuntime


@dataclass(frozen=True)
class Pki:
    server_ca: Path  # signs the extender's serving cert: what the scheduler's tlsConfig.caFile trusts
    client_ca: Path  # signs the scheduler's client cert: the extender's --client-ca
    server: certs.Pem
    client: certs.Pem
    stranger: certs.Pem  # a client cert from another CA


def _write(directory: Path, name: str, pem: certs.Pem) -> tuple[Path, Path]:
    crt, key = directory / f"{name}.crt", directory / f"{name}.key"
    certs.write_pem(pem, crt, key)
    return crt, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    server_ca_cert, server_ca_key = certs.make_ca("test-extender-ca")
    client_ca_cert, client_ca_key = certs.make_ca("test-scheduler-client-ca")
    other_ca_cert, other_ca_key = certs.make_ca("someone-else")
    _write(d, "server-ca", certs.to_pem(server_ca_cert, server_ca_key))
    _write(d, "client-ca", certs.to_pem(client_ca_cert, client_ca_key))
    server = certs.to_pem(
        *certs.issue_serving_cert(server_ca_cert, server_ca_key, ["localhost"], ["127.0.0.1"])
    )
    client = certs.to_pem(*certs.issue_client_cert(client_ca_cert, client_ca_key, "kube-scheduler"))
    stranger = certs.to_pem(*certs.issue_client_cert(other_ca_cert, other_ca_key, "kube-scheduler"))
    return Pki(d / "server-ca.crt", d / "client-ca.crt", server, client, stranger)


@dataclass(frozen=True)
class Served:
    port: int
    ops_port: int
    pki: Pki
    dir: Path
    main: uvicorn.Server


@pytest.fixture(scope="module")
def served(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    d = tmp_path_factory.mktemp("serve")
    crt, key = _write(d, "server", pki.server)
    port, ops_port = free_ports(2)
    settings = Settings(
        host="127.0.0.1",
        port=port,
        ops_port=ops_port,
        tls_cert_file=str(crt),
        tls_key_file=str(key),
        client_ca_file=str(pki.client_ca),
    )
    cache = ClusterCache(AssumeCache(ttl_s=60))
    policy = registry.create("binpack")
    runtime = StaticRuntime(cache, policy, Binder(None, cache, policy))  # type: ignore[arg-type]
    main, ops = servers(create_app(settings, runtime=runtime), settings)
    thread = threading.Thread(target=run, args=(main, ops), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not (main.started and ops.started):
        assert thread.is_alive() and time.monotonic() < deadline, "extender did not start"
        time.sleep(0.02)
    yield Served(port, ops_port, pki, d, main)
    main.should_exit = True
    thread.join(10)
    assert not thread.is_alive()


def client_context(served: Served, pem: certs.Pem | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(served.pki.server_ca))
    if pem is not None:
        name = "client" if pem is served.pki.client else "stranger"
        crt, key = _write(served.dir, name, pem)
        ctx.load_cert_chain(crt, key)
    return ctx


def https(
    served: Served, pem: certs.Pem | None, method: str, path: str, body: object = None
) -> tuple[int, str]:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", served.port, context=client_context(served, pem), timeout=5
    )
    try:
        payload = None if body is None else json.dumps(body)
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def plain(served: Served, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", served.ops_port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


FILTER = {"Pod": {"metadata": {"name": "p", "uid": "u"}, "spec": {"containers": []}}, "NodeNames": ["n1"]}


def test_scheduler_with_its_client_certificate_is_served(served: Served) -> None:
    status, text = https(served, served.pki.client, "POST", "/filter", FILTER)
    assert status == 200, text
    # Served: the verb ran and judged the pod (one the webhook never admitted).
    reason = json.loads(text)["FailedAndUnresolvableNodes"]["n1"]
    assert reason.startswith("not admitted by the gpupack webhook"), reason
    assert https(served, served.pki.client, "GET", "/state")[0] == 200
    assert https(served, served.pki.client, "GET", "/healthz")[0] == 200


def test_served_on_uvloop(served: Served) -> None:
    """Both listeners run on the loop uvicorn picks for one server: uvloop, a gpupack dependency."""
    loop = served.main.servers[0].get_loop()
    assert type(loop).__module__.split(".")[0] == "uvloop", type(loop)


@pytest.mark.parametrize("who", ["no-certificate", "other-ca"])
@pytest.mark.parametrize(("method", "path"), [("POST", "/bind"), ("POST", "/filter"), ("GET", "/state")])
def test_callers_without_a_trusted_client_certificate_are_refused_in_the_handshake(
    served: Served, who: str, method: str, path: str
) -> None:
    pem = None if who == "no-certificate" else served.pki.stranger
    # TLS 1.3 lets the client finish first; the server's alert arrives on the first read.
    with pytest.raises((ssl.SSLError, ConnectionError)):
        https(served, pem, method, path, {"PodName": "p", "PodNamespace": "ns", "Node": "n1"})


def test_plain_http_on_the_scheduler_port_is_not_served(served: Served) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=5)
    try:
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            conn.request("POST", "/bind", body="{}")
            resp = conn.getresponse()
            # uvicorn answers non-TLS bytes on a TLS port by closing; never a 2xx
            assert resp.status >= 400
            raise ConnectionError(f"answered {resp.status}")
    finally:
        conn.close()


def test_ops_port_serves_probes_and_metrics_only(served: Served) -> None:
    assert plain(served, "/healthz") == 200
    assert plain(served, "/readyz") == 200
    assert plain(served, "/metrics") == 200
    for path in ("/state", "/explain?pod=a/b", "/docs", "/openapi.json"):
        assert plain(served, path) == 404, path
    conn = http.client.HTTPConnection("127.0.0.1", served.ops_port, timeout=5)
    conn.request("POST", "/bind", body="{}")
    assert conn.getresponse().status in (404, 405)
    conn.close()


def test_no_api_docs_on_the_scheduler_port(served: Served) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert https(served, served.pki.client, "GET", path)[0] == 404, path


def test_tls_settings_are_checked_with_flag_value_and_rule(tmp_path: Path) -> None:
    assert [str(e) for e in Settings().serving_errors()] == [
        f"{name}=None: required; the scheduler-facing port serves only HTTPS with a client certificate"
        for name in ("tls_cert_file", "tls_key_file", "client_ca_file")
    ]
    missing = str(tmp_path / "nope.crt")
    errors = Settings(
        tls_cert_file=missing, tls_key_file=missing, client_ca_file=missing, ops_port=8888
    ).validate()
    assert errors[0].as_flag() == "--ops-port=8888: must be in 1..65535 and differ from port=8888"
    assert errors[1].as_flag() == (
        f"--tls-cert={missing!r}: must name a readable PEM file (all three TLS files go together)"
    )
    assert [e.flag for e in errors[1:4]] == ["--tls-cert", "--tls-key", "--client-ca"]
