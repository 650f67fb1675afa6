"""Dev cluster: the CA and serving certs (SANs, chain, key usage) and a real TLS handshake against them."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID

from app.service.tls import ReloadingContext
from tests.devcluster import pki


def _sans(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)], ext.get_values_for_type(x509.DNSName)


def test_ip_names_become_ip_sans_not_dns() -> None:
    entries = pki.san_entries(("127.0.0.1", "localhost", "::1"))
    assert entries == [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]


def test_server_cert_is_signed_by_the_ca_for_server_auth() -> None:
    ca, ca_key = pki.make_ca()
    cert, _ = pki.issue_server_cert(ca, ca_key, "gpupack-webhook", pki.LOOPBACK_SANS)
    cert.verify_directly_issued_by(ca)
    assert _sans(cert) == (["127.0.0.1"], ["localhost"])
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True


def test_other_ca_does_not_verify() -> None:
    ca, ca_key = pki.make_ca()
    other, _ = pki.make_ca()
    cert, _ = pki.issue_server_cert(ca, ca_key, "x", pki.LOOPBACK_SANS)
    with pytest.raises(InvalidSignature):  # same subject name, different key
        cert.verify_directly_issued_by(other)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> pki.Pki:
    out = pki.Pki(tmp_path_factory.mktemp("pki"))
    out.write()
    return out


def test_apiserver_cert_answers_to_the_service_names(written: pki.Pki) -> None:
    cert = x509.load_pem_x509_certificate(written.apiserver.cert.read_bytes())
    ips, dns = _sans(cert)
    # Loopback, the `kubernetes` Service IP, and the real node's IP (its pods reach the apiserver there).
    assert ips == ["127.0.0.1", "10.0.0.1", "10.250.0.1"]
    assert {"localhost", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"} <= set(dns)


def test_kubelet_client_cert_names_the_user_bound_to_the_kubelet_api(written: pki.Pki) -> None:
    cert = x509.load_pem_x509_certificate(written.kubelet_client.cert.read_bytes())
    assert cert.subject.rfc4514_string() == f"CN={pki.KUBELET_CLIENT_USER}"
    ca = x509.load_pem_x509_certificate(written.ca.cert.read_bytes())
    assert cert.issuer == ca.subject  # the CA the apiserver's --client-ca-file names, which kubelets trust


def test_private_keys_are_owner_only(written: pki.Pki) -> None:
    for key in (
        written.ca.key,
        written.apiserver.key,
        written.webhook.key,
        written.scheduler.key,
        written.extender.key,
        written.extender_client_ca.key,
        written.scheduler_client.key,
        written.sa_key,
    ):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert written.sa_pub.read_text().startswith("-----BEGIN PUBLIC KEY-----")


def _handshake(written: pki.Pki, server_hostname: str) -> str:
    """TLS over a socketpair: the webhook cert, checked against our CA by a client of `server_hostname`."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(written.webhook.cert, written.webhook.key)
    client_ctx = ssl.create_default_context(cafile=str(written.ca.cert))
    a, b = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(a, server_side=True) as conn:
                conn.sendall(b"ok")
        except (ssl.SSLError, OSError) as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname=server_hostname) as conn:
            return conn.recv(2).decode()
    finally:
        thread.join(5)


def test_webhook_cert_verifies_for_127_0_0_1(written: pki.Pki) -> None:
    assert _handshake(written, "127.0.0.1") == "ok"


def test_webhook_cert_is_refused_for_another_host(written: pki.Pki) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match=r"127\.0\.0\.2"):
        _handshake(written, "127.0.0.2")


def test_write_creates_every_path(written: pki.Pki) -> None:
    paths: list[Path] = [written.sa_key, written.sa_pub]
    for pair in (
        written.ca,
        written.apiserver,
        written.scheduler,
        written.controller_manager,
        written.webhook,
        written.extender,
        written.extender_client_ca,
        written.scheduler_client,
    ):
        paths += [pair.cert, pair.key]
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)


def _mutual(written: pki.Pki, client: pki.CertPaths | None) -> str:
    """The extender's context (app.service.tls) against a client presenting `client`, over a socketpair."""
    tls = ReloadingContext(
        written.extender.cert, written.extender.key, client_ca=written.extender_client_ca.cert
    )
    client_ctx = ssl.create_default_context(cafile=str(written.ca.cert))
    if client is not None:
        client_ctx.load_cert_chain(client.cert, client.key)
    a, b = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with tls.context.wrap_socket(a, server_side=True) as conn:
                conn.sendall(b"ok")
        except (ssl.SSLError, OSError) as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname="127.0.0.1") as conn:
            return conn.recv(2).decode()
    finally:
        thread.join(5)
        b.close()


def test_extender_accepts_the_schedulers_client_cert(written: pki.Pki) -> None:
    assert _mutual(written, written.scheduler_client) == "ok"


@pytest.mark.parametrize("who", ["none", "scheduler-serving-cert", "webhook-serving-cert"])
def test_extender_refuses_other_certificates_of_the_dev_ca(written: pki.Pki, who: str) -> None:
    """Signed by the dev CA is not enough: only the extender's own client CA gets in."""
    client = {
        "none": None,
        "scheduler-serving-cert": written.scheduler,
        "webhook-serving-cert": written.webhook,
    }
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _mutual(written, client[who])
