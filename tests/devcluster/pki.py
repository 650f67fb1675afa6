"""The dev cluster's PKI: a CA, serving certs (apiserver, scheduler, controller-manager, webhook,
extender), the service-account key, and the extender's client CA with the one client certificate it signs: the
kube-scheduler's, which the extender requires (mutual TLS).

The certificates themselves come from `app.service.certs`, as `gpupack certs` makes the webhook's.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from app.service import certs

from . import realnode

_VALIDITY_DAYS = 365

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
    # A real node's pods reach the apiserver at their node's IP (kubeletnode's relay).
    realnode.node_ip(realnode.DEFAULT_SUBNET),
)


# The user kube-apiserver is to a kubelet; it needs system:kubelet-api-admin there (kubeletnode.py binds it).
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"


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


def make_ca(common_name: str = "gpupack-dev-ca") -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    return certs.make_ca(common_name, days=_VALIDITY_DAYS)


def issue_server_cert(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    sans: tuple[str, ...],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A TLS serving certificate for `sans`, signed by the CA."""
    entries = san_entries(sans)
    dns = [e.value for e in entries if isinstance(e, x509.DNSName)]
    ips = [str(e.value) for e in entries if isinstance(e, x509.IPAddress)]
    return certs.issue_serving_cert(ca_cert, ca_key, dns, ips, days=_VALIDITY_DAYS, common_name=common_name)


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
    def controller_manager(self) -> CertPaths:
        """kube-controller-manager's serving certificate (its /healthz), as the scheduler's."""
        return CertPaths(self.dir / "controller-manager.crt", self.dir / "controller-manager.key")

    @property
    def webhook(self) -> CertPaths:
        return CertPaths(self.dir / "webhook.crt", self.dir / "webhook.key")

    @property
    def extender(self) -> CertPaths:
        """The extender's serving certificate (signed by `ca`, which the scheduler's caFile names)."""
        return CertPaths(self.dir / "extender.crt", self.dir / "extender.key")

    @property
    def extender_client_ca(self) -> CertPaths:
        """A CA of its own for the extender's callers, so no other certificate of `ca` gets in."""
        return CertPaths(self.dir / "extender-client-ca.crt", self.dir / "extender-client-ca.key")

    @property
    def scheduler_client(self) -> CertPaths:
        """kube-scheduler's client certificate for the extender (signed by `extender_client_ca`)."""
        return CertPaths(self.dir / "scheduler-client.crt", self.dir / "scheduler-client.key")

    @property
    def kubelet_client(self) -> CertPaths:
        """kube-apiserver's client certificate for kubelets (`kubectl logs/exec` on a real node)."""
        return CertPaths(self.dir / "kubelet-client.crt", self.dir / "kubelet-client.key")

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def write(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        ca_cert, ca_key = make_ca()
        certs.write_pem(certs.to_pem(ca_cert, ca_key), self.ca.cert, self.ca.key)
        for paths, cn, sans in (
            (self.apiserver, "kube-apiserver", APISERVER_SANS),
            (self.scheduler, "kube-scheduler", LOOPBACK_SANS),
            (self.controller_manager, "kube-controller-manager", LOOPBACK_SANS),
            (self.webhook, "gpupack-webhook", LOOPBACK_SANS),
            (self.extender, "gpupack-extender", LOOPBACK_SANS),
        ):
            serving = certs.to_pem(*issue_server_cert(ca_cert, ca_key, cn, sans))
            certs.write_pem(serving, paths.cert, paths.key)
        client_ca_cert, client_ca_key = make_ca("gpupack-dev-extender-client-ca")
        certs.write_pem(
            certs.to_pem(client_ca_cert, client_ca_key),
            self.extender_client_ca.cert,
            self.extender_client_ca.key,
        )
        client = certs.issue_client_cert(client_ca_cert, client_ca_key, "kube-scheduler", days=_VALIDITY_DAYS)
        certs.write_pem(certs.to_pem(*client), self.scheduler_client.cert, self.scheduler_client.key)
        kubelet_client = certs.issue_client_cert(ca_cert, ca_key, KUBELET_CLIENT_USER, days=_VALIDITY_DAYS)
        certs.write_pem(certs.to_pem(*kubelet_client), self.kubelet_client.cert, self.kubelet_client.key)
        sa = certs.new_key()
        certs.write_atomic(self.sa_key, certs.key_pem(sa), 0o600)
        pub = sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        certs.write_atomic(self.sa_pub, pub, 0o644)
