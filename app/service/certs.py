"""A private CA and TLS serving certificates, EC P-256.

For the webhook (`gpupack certs`: what the apiserver's caBundle must trust) and the dev cluster's PKI.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT: Final = "ca.crt"
CA_KEY: Final = "ca.key"
TLS_CERT: Final = "tls.crt"  # the names a kubernetes.io/tls Secret uses, so a mounted Secret just works
TLS_KEY: Final = "tls.key"
# Backdate notBefore a little: a node whose clock runs behind would otherwise reject a brand-new cert.
_CLOCK_SKEW: Final = dt.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class Pem:
    cert: bytes
    key: bytes


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names a client inside the cluster may use for a Service; the apiserver uses `<svc>.<ns>.svc`."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def new_key() -> ec.EllipticCurvePrivateKey:
    """EC P-256: Go and Python accept it, and it takes microseconds where an RSA key takes tens of ms."""
    return ec.generate_private_key(ec.SECP256R1())


def make_ca(
    common_name: str = "gpupack-webhook-ca", days: int = 3650
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA that may sign leaf certificates only (pathLen 0)."""
    key = new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def new_ca(common_name: str = "gpupack-webhook-ca", days: int = 3650) -> Pem:
    return to_pem(*make_ca(common_name, days))


def issue_serving_cert(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    dns: Sequence[str],
    ips: Sequence[str],
    *,
    days: int = 365,
    common_name: str | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A serverAuth certificate signed by the CA. Go's TLS ignores the CN, so every name must be a SAN.

    The CN defaults to the first name; it never outlives the CA.
    """
    if not dns and not ips:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cn = common_name or (list(dns) or list(ips))[0]
    return _issue_leaf(ca_cert, ca_key, cn, days, ExtendedKeyUsageOID.SERVER_AUTH, sans)


def issue_client_cert(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    *,
    days: int = 365,
    organizations: Sequence[str] = (),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A clientAuth-only certificate signed by the CA: what kube-scheduler presents to the extender.

    No serverAuth and no SANs, so it cannot stand in for a server; it never outlives the CA.
    `organizations` become O= entries: the groups kube-apiserver reads from a client certificate.
    """
    return _issue_leaf(ca_cert, ca_key, common_name, days, ExtendedKeyUsageOID.CLIENT_AUTH, [], organizations)


def _issue_leaf(  # noqa: PLR0917 (private; the two issuers differ in exactly these)
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    days: int,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
    organizations: Sequence[str] = (),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A non-CA certificate for one extended key usage, signed by the CA and never outliving it."""
    key = new_key()
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations),
                    x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = (
        builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def new_serving_cert(
    ca: Pem, dns: Sequence[str], ips: Sequence[str], days: int = 365, *, common_name: str | None = None
) -> Pem:
    """`issue_serving_cert` for a CA given as PEM (as `gpupack certs` writes it)."""
    ca_cert, ca_key = _load_ca(ca)
    return to_pem(*issue_serving_cert(ca_cert, ca_key, dns, ips, days=days, common_name=common_name))


def new_client_cert(ca: Pem, common_name: str, days: int = 365, *, organizations: Sequence[str] = ()) -> Pem:
    """`issue_client_cert` for a CA given as PEM."""
    ca_cert, ca_key = _load_ca(ca)
    return to_pem(*issue_client_cert(ca_cert, ca_key, common_name, days=days, organizations=organizations))


def _load_ca(ca: Pem) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key must be an EC key (as `gpupack certs` makes it)")
    return ca_cert, ca_key


def to_pem(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pem:
    return Pem(cert.public_bytes(serialization.Encoding.PEM), key_pem(key))


def write_pem(pem: Pem, cert: Path, key: Path) -> None:
    """Key before certificate, each replaced atomically (see `write_bundle`); the key is owner-only."""
    write_atomic(key, pem.key, 0o600)
    write_atomic(cert, pem.cert, 0o644)


def ca_bundle(ca_cert_pem: bytes) -> str:
    """The MutatingWebhookConfiguration's clientConfig.caBundle: base64 of the PEM."""
    return base64.b64encode(ca_cert_pem).decode()


def write_bundle(
    out: Path, dns: Sequence[str], ips: Sequence[str], days: int = 365, fresh_ca: bool = False
) -> str:
    """Write ca.crt/ca.key (kept if present, so the caBundle survives a rotation) and tls.crt/tls.key.

    Returns the caBundle. Each file is replaced atomically, key before certificate, so a server that
    reloads on change never reads half a file (and retries if it sees a new cert with the old key).
    """
    out.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = out / CA_CERT, out / CA_KEY
    if fresh_ca or not (ca_cert.exists() and ca_key.exists()):
        ca = new_ca()
        write_pem(ca, ca_cert, ca_key)
    else:
        ca = Pem(ca_cert.read_bytes(), ca_key.read_bytes())
    write_pem(new_serving_cert(ca, dns, ips, days), out / TLS_CERT, out / TLS_KEY)
    return ca_bundle(ca.cert)


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,  # EC keys sign; they never encipher
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
