"""certs.mode=helm against the real apiserver: the CA is kept, certificates are re-issued when due.

The chart looks the Secrets up (`lookup`), which needs a live cluster at render time: these renders use
`helm template --dry-run=server` with the admin kubeconfig, apply the Secrets for real, and render again,
as `helm upgrade` would. helm comes from $GPUPACK_HELM or tests/helm/build.sh (cached).
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from app.service import certs
from tests.devcluster import Cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy/helm/gpupack"
HELM_MODE = ("webhook.certs.mode=helm",)


@pytest.fixture(scope="module")
def helm() -> str:
    if os.environ.get("GPUPACK_HELM"):
        return os.environ["GPUPACK_HELM"]
    out = subprocess.run([str(REPO / "tests/helm/build.sh")], check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


def render_live(helm: str, cluster: Cluster, release: str, namespace: str) -> dict[tuple[str, str], Any]:
    """(kind, name) -> object, rendered with lookups against the cluster (what `helm upgrade` sees)."""
    args = [helm, "template", release, str(CHART), "--namespace", namespace, "--dry-run=server"]
    args += ["--kubeconfig", str(cluster.kubeconfig)]
    for s in HELM_MODE:
        args += ["--set", s]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}


def apply_secrets(core: Any, namespace: str, objs: dict[tuple[str, str], Any]) -> None:
    for (kind, name), obj in objs.items():
        if kind != "Secret":
            continue
        body = {k: obj[k] for k in ("apiVersion", "kind", "metadata", "type", "data")}
        try:
            core.replace_namespaced_secret(name, namespace, body)
        except Exception:  # not there yet
            core.create_namespaced_secret(namespace, body)


def cert(secret: dict[str, Any], key: str = "tls.crt") -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(secret["data"][key]))


def secret_data(objs: dict[tuple[str, str], Any]) -> dict[str, dict[str, str]]:
    return {name: o["data"] for (kind, name), o in objs.items() if kind == "Secret"}


def ca_bundle(objs: dict[tuple[str, str], Any]) -> list[x509.Certificate]:
    mwc = next(o for (kind, _), o in objs.items() if kind == "MutatingWebhookConfiguration")
    bundles = {w["clientConfig"]["caBundle"] for w in mwc["webhooks"]}
    assert len(bundles) == 1
    return x509.load_pem_x509_certificates(base64.b64decode(bundles.pop()))


def test_helm_mode_keeps_the_ca_and_renews_certificates_when_due(
    helm: str, cluster: Cluster, core: Any, namespace: str
) -> None:
    release = f"c-{uuid.uuid4().hex[:6]}"
    full = f"{release}-gpupack"
    hook, ext, client = f"{full}-webhook-tls", f"{full}-extender-tls", f"{full}-scheduler-client"
    first = render_live(helm, cluster, release, namespace)
    data1 = secret_data(first)
    assert set(data1) == {f"{full}-webhook-ca", hook, f"{full}-extender-ca", ext, client}
    (webhook_ca,) = ca_bundle(first)
    cert(first["Secret", hook]).verify_directly_issued_by(webhook_ca)
    extender_ca = cert(first["Secret", f"{full}-extender-ca"])
    for name in (ext, client):
        cert(first["Secret", name]).verify_directly_issued_by(extender_ca)
    # due after 2/3 of the 365 days, recorded on each certificate's Secret
    due = dt.datetime.fromisoformat(
        first["Secret", hook]["metadata"]["annotations"]["gpupack.io/renew-after"]
    )
    now = dt.datetime.now(dt.UTC)
    assert abs((due - now) - dt.timedelta(days=365 * 2 / 3)) < dt.timedelta(hours=2)

    # an upgrade with nothing due changes nothing: no new CA, no new certificate, same caBundle
    apply_secrets(core, namespace, first)
    second = render_live(helm, cluster, release, namespace)
    assert secret_data(second) == data1
    assert ca_bundle(second) == [webhook_ca]

    # the webhook's and the extender's serving certificates come due: re-issued from the same CAs
    for name in (hook, ext):
        patch = {"metadata": {"annotations": {"gpupack.io/renew-after": "2000-01-01T00:00:00Z"}}}
        core.patch_namespaced_secret(name, namespace, patch)
    third = render_live(helm, cluster, release, namespace)
    data3 = secret_data(third)
    for name in (hook, ext):
        assert data3[name]["tls.crt"] != data1[name]["tls.crt"], name
        assert data3[name]["tls.key"] != data1[name]["tls.key"], name
        renewed = dt.datetime.fromisoformat(
            third["Secret", name]["metadata"]["annotations"]["gpupack.io/renew-after"]
        )
        assert renewed > now + dt.timedelta(days=200), name
    cert(third["Secret", hook]).verify_directly_issued_by(webhook_ca)
    cert(third["Secret", ext]).verify_directly_issued_by(extender_ca)
    assert data3[client] == data1[client]  # not due
    assert data3[f"{full}-webhook-ca"] == data1[f"{full}-webhook-ca"]
    assert data3[f"{full}-extender-ca"] == data1[f"{full}-extender-ca"]
    assert ca_bundle(third) == [webhook_ca]  # the apiserver's trust never changes


def test_upgrade_from_a_release_without_the_ca_secret_trusts_both_cas(
    helm: str, cluster: Cluster, core: Any, namespace: str
) -> None:
    """Earlier charts kept the webhook CA only in the serving Secret (no key): a new CA is made, and the
    caBundle carries both while webhook pods still serve the old certificate."""
    release = f"c-{uuid.uuid4().hex[:6]}"
    hook = f"{release}-gpupack-webhook-tls"
    old_ca = certs.new_ca("old-webhook-ca")
    old_leaf = certs.new_serving_cert(old_ca, [f"{release}-gpupack-webhook.{namespace}.svc"], [])
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": hook},
            "type": "kubernetes.io/tls",
            "data": {"ca.crt": b64(old_ca.cert), "tls.crt": b64(old_leaf.cert), "tls.key": b64(old_leaf.key)},
        },
    )
    objs = render_live(helm, cluster, release, namespace)
    bundle = ca_bundle(objs)
    new_ca = cert(objs["Secret", f"{release}-gpupack-webhook-ca"])
    assert bundle == [new_ca, x509.load_pem_x509_certificate(old_ca.cert)]
    cert(objs["Secret", hook]).verify_directly_issued_by(new_ca)


def render_offline(helm: str, *sets: str) -> list[dict[str, Any]]:
    args = [helm, "template", "gpupack", str(CHART), "--namespace", "gpupack-system"]
    for s in sets:
        args += ["--set", s]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def https_peers(objs: list[dict[str, Any]]) -> list[Any] | None:
    """The `from` of the NetworkPolicy rule for the extender's https port; None when there is no such rule."""
    policy = next(o for o in objs if o["kind"] == "NetworkPolicy")
    rules = [r for r in policy["spec"].get("ingress") or [] if r["ports"][0]["port"] == "https"]
    return rules[0]["from"] if rules else None


def test_network_policy_never_opens_the_https_port_to_everyone(helm: str) -> None:
    """With scheduler.mode=default no scheduler pod exists to select: no rule (deny), not an empty `from`."""
    assert https_peers(render_offline(helm, "scheduler.mode=default")) is None
    block = "extender.networkPolicy.schedulerFrom[0].ipBlock.cidr=10.0.0.0/24"
    assert https_peers(render_offline(helm, "scheduler.mode=default", block)) == [
        {"ipBlock": {"cidr": "10.0.0.0/24"}}
    ]
    peers = https_peers(render_offline(helm))
    assert (
        peers is not None
        and len(peers) == 1
        and peers[0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "scheduler"
    )
