"""The dev cluster's PKI: a CA, serving certs (apiserver, scheduler, webhook), the service-account key."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# EC P-256 everywhere: Go and Python accept it, and key generation takes microseconds instead of the
# tens of milliseconds an RSA key costs, which matters for a cluster made fresh per test session.
_VALIDITY = dt.timedelta(days=365)
_SKEW = dt.timedelta(hours=1)  # not-before in the past so a slightly skewed clock still accepts a fresh cert

LOOPBACK_SANS: tuple[str, ...] = ("127.0.0.1", "localhost")
# Names the in-cluster `kubernetes` Service would answer to; 10.0.0.1 is the first IP of the service range
# the apiserver is started with (components.SERVICE_CIDR).
APISERVER_SANS: tuple[str, ...] = (
    *LOOPBACK_SANS,
    "10.0.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class CertPaths:
    cert: Path
    key: Path


def san_entries(names: tuple[str, ...]) -> list[x509.GeneralName]:
    """IP addresses become IP SANs, everything else DNS SANs (Go matches an IP host only against IP SANs)."""
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_ca(common_name: str = "gpupack-dev-ca") -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - _SKEW)
        .not_valid_after(_now() + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue_server_cert(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    sans: tuple[str, ...],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A TLS serving certificate for `sans`, signed by the CA."""
    key = _key()
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - _SKEW)
        .not_valid_after(_now() + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(san_entries(sans)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@dataclass(frozen=True)
class Pki:
    """Where the PKI files live; `write` creates them all."""

    dir: Path

    @property
    def ca(self) -> CertPaths:
        return CertPaths(self.dir / "ca.crt", self.dir / "ca.key")

    @property
    def apiserver(self) -> CertPaths:
        return CertPaths(self.dir / "apiserver.crt", self.dir / "apiserver.key")

    @property
    def scheduler(self) -> CertPaths:
        return CertPaths(self.dir / "scheduler.crt", self.dir / "scheduler.key")

    @property
    def webhook(self) -> CertPaths:
        return CertPaths(self.dir / "webhook.crt", self.dir / "webhook.key")

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def write(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        ca_cert, ca_key = make_ca()
        _write_cert(self.ca.cert, ca_cert)
        _write_key(self.ca.key, ca_key)
        for paths, cn, sans in (
            (self.apiserver, "kube-apiserver", APISERVER_SANS),
            (self.scheduler, "kube-scheduler", LOOPBACK_SANS),
            (self.webhook, "gpupack-webhook", LOOPBACK_SANS),
        ):
            cert, key = issue_server_cert(ca_cert, ca_key, cn, sans)
            _write_cert(paths.cert, cert)
            _write_key(paths.key, key)
        sa = _key()
        _write_key(self.sa_key, sa)
        self.sa_pub.write_bytes(
            sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
