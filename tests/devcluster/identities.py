"""Who talks to the dev apiserver: one static bearer token and one kubeconfig per identity."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The gpupack components run as these ServiceAccounts when deployed; the dev cluster authenticates their
# static tokens *as the same usernames*, so the chart's RBAC (ServiceAccount subjects) applies unchanged.
GPUPACK_NAMESPACE = "gpupack-system"


def _service_account(name: str) -> tuple[str, tuple[str, ...]]:
    return (
        f"system:serviceaccount:{GPUPACK_NAMESPACE}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{GPUPACK_NAMESPACE}"),
    )


@dataclass(frozen=True)
class Identity:
    key: str  # short name used for files and lookups
    user: str  # the username the apiserver sees
    groups: tuple[str, ...]


IDENTITIES: tuple[Identity, ...] = (
    Identity("admin", "admin", ("system:masters",)),
    # The bootstrap RBAC policy binds this exact user name to the scheduler's ClusterRoles.
    Identity("scheduler", "system:kube-scheduler", ()),
    # Likewise for this one; with --use-service-account-credentials it only reads, creates ServiceAccounts
    # and asks for their tokens, and each controller then runs as its own kube-system ServiceAccount.
    Identity("controller-manager", "system:kube-controller-manager", ()),
    # kwok stands in for every kubelet (node status, leases, pod status, pod deletion); system:masters
    # keeps its permissions from being a moving part of the tests.
    Identity("kwok", "kwok", ("system:masters",)),
    Identity("gpupack-extender", *_service_account("gpupack-extender")),
    Identity("gpupack-webhook", *_service_account("gpupack-webhook")),
    Identity("gpupack-agent", *_service_account("gpupack-agent")),
    # A cluster user with no rights of its own: tests grant it pod rights in one namespace (a Role), to
    # prove what a tenant can and cannot do to gpupack's allocation metadata through the real apiserver.
    Identity("tenant", "tenant", ("tenants",)),
)
IDENTITY_KEYS: tuple[str, ...] = tuple(i.key for i in IDENTITIES)


def new_tokens() -> dict[str, str]:
    """A fresh random token per identity (urlsafe: no commas or quotes, so the CSV needs no escaping)."""
    return {i.key: secrets.token_urlsafe(24) for i in IDENTITIES}


def token_csv(tokens: Mapping[str, str]) -> str:
    """The apiserver's --token-auth-file: token,user,uid,"group1,group2"."""
    lines = []
    for ident in IDENTITIES:
        row = f"{tokens[ident.key]},{ident.user},uid-{ident.key}"
        if ident.groups:
            row += ',"' + ",".join(ident.groups) + '"'
        lines.append(row)
    return "\n".join(lines) + "\n"


def kubeconfig(server: str, ca_file: str, user: str, token: str) -> dict[str, Any]:
    """A single-context kubeconfig (as a dict; the caller serializes it)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "gpupack-dev", "cluster": {"server": server, "certificate-authority": ca_file}}
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "gpupack-dev", "context": {"cluster": "gpupack-dev", "user": user}}],
        "current-context": "gpupack-dev",
        "preferences": {},
    }
