"""Render deploy/scheduler/kube-scheduler-config.yaml for a local kube-scheduler."""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

TEMPLATE_RELPATH = Path("deploy/scheduler/kube-scheduler-config.yaml")

# A single local scheduler needs no leader election (it would only delay the start by a lease period),
# and short backoffs let a test see a pod retried within seconds after the extender or a node changes.
TEST_OVERRIDES: Mapping[str, Any] = {
    "leaderElection": {"leaderElect": False},
    "podInitialBackoffSeconds": 1,
    "podMaxBackoffSeconds": 2,
}


@dataclass(frozen=True)
class ExtenderTLS:
    """The scheduler's side of mutual TLS with the extender (the Extender's tlsConfig)."""

    ca_file: str  # verifies the extender's serving certificate
    cert_file: str  # the scheduler's client certificate
    key_file: str


# Where the Helm chart mounts the scheduler's client Secret (tls.crt, tls.key, ca.crt) in its pods.
CHART_TLS_DIR = "/etc/gpupack-scheduler/extender-client"
CHART_TLS = ExtenderTLS(f"{CHART_TLS_DIR}/ca.crt", f"{CHART_TLS_DIR}/tls.crt", f"{CHART_TLS_DIR}/tls.key")


def template_path(repo_root: Path) -> Path:
    return repo_root / TEMPLATE_RELPATH


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def render(
    template: str,
    *,
    kubeconfig: str,
    extender_url: str,
    tls: ExtenderTLS,
    overrides: Mapping[str, Any] = TEST_OVERRIDES,
) -> dict[str, Any]:
    """Substitute the placeholders, parse, deep-merge `overrides`; KeyError on an unknown placeholder."""
    text = string.Template(template).substitute(
        KUBECONFIG=kubeconfig,
        EXTENDER_URL=extender_url,
        EXTENDER_CA_FILE=tls.ca_file,
        EXTENDER_CLIENT_CERT=tls.cert_file,
        EXTENDER_CLIENT_KEY=tls.key_file,
    )
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or doc.get("kind") != "KubeSchedulerConfiguration":
        raise ValueError("scheduler config template is not a KubeSchedulerConfiguration")
    return _merge(doc, overrides)
