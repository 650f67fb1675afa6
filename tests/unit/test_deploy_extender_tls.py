"""The chart's side of mutual TLS between kube-scheduler and the extender, and of certificate renewal.

Checked on deploy/manifests/gpupack.yaml (the chart with default values, certs.mode=certManager, rendered
by tests/helm/render.py); Helm-generated certificates and their renewal need `lookup` against a live
apiserver and are covered by tests/integration/test_deploy_certs.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import build_parser
from tests.devcluster import schedconfig

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deploy/manifests/gpupack.yaml"
VALUES = REPO / "deploy/helm/gpupack/values.yaml"


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, (kind, name)
    return matches[0]


def pod_spec(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(objects, "Deployment", name)["spec"]["template"]["spec"]
    return spec


def secret_mounts(spec: dict[str, Any]) -> dict[str, str]:
    """mountPath -> Secret name of the first container."""
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    return {
        m["mountPath"]: secrets[m["name"]]
        for m in spec["containers"][0]["volumeMounts"]
        if m["name"] in secrets
    }


def test_extender_serves_mutual_tls_with_the_mounted_secret(objects: list[dict[str, Any]]) -> None:
    spec = pod_spec(objects, "gpupack-extender")
    c = spec["containers"][0]
    args = build_parser().parse_args(c["args"])
    assert (args.port, args.ops_port) == (8888, 8889)
    assert (args.tls_cert, args.tls_key, args.client_ca) == (
        "/certs/tls.crt",
        "/certs/tls.key",
        "/certs/ca.crt",
    )
    assert secret_mounts(spec) == {"/certs": "gpupack-extender-tls"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"https": 8888, "metrics": 8889}
    # probes cannot present the scheduler's certificate: they use the plain ops port
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    annotations = find(objects, "Deployment", "gpupack-extender")["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert (annotations["prometheus.io/port"], annotations["prometheus.io/scheme"]) == ("8889", "http")
    svc = find(objects, "Service", "gpupack-extender")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == {
        "https": (8888, "https"),
        "metrics": (8889, "metrics"),
    }
    monitor_ports = [
        e["port"] for o in objects if o["kind"] == "ServiceMonitor" for e in o["spec"]["endpoints"]
    ]
    assert "http" not in monitor_ports


def test_scheduler_calls_https_with_its_client_certificate(objects: list[dict[str, Any]]) -> None:
    conf = yaml.safe_load(
        find(objects, "ConfigMap", "gpupack-scheduler-config")["data"]["kube-scheduler-config.yaml"]
    )
    (ext,) = conf["extenders"]
    assert ext["urlPrefix"] == "https://gpupack-extender.gpupack-system.svc:8888"
    assert ext["enableHTTPS"] is True
    tls = schedconfig.CHART_TLS
    assert ext["tlsConfig"] == {"caFile": tls.ca_file, "certFile": tls.cert_file, "keyFile": tls.key_file}
    spec = pod_spec(objects, "gpupack-scheduler")
    assert secret_mounts(spec) == {schedconfig.CHART_TLS_DIR: "gpupack-scheduler-client"}
    for path in (tls.ca_file, tls.cert_file, tls.key_file):
        assert path.startswith(schedconfig.CHART_TLS_DIR + "/")


def test_one_extender_ca_signs_the_serving_and_the_client_certificate(objects: list[dict[str, Any]]) -> None:
    certs = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "Certificate"}
    serving, client = certs["gpupack-extender-tls"], certs["gpupack-scheduler-client"]
    assert (
        serving["secretName"] == "gpupack-extender-tls" and client["secretName"] == "gpupack-scheduler-client"
    )
    assert serving["issuerRef"] == client["issuerRef"] == {"name": "gpupack-extender-ca", "kind": "Issuer"}
    assert "gpupack-extender.gpupack-system.svc" in serving["dnsNames"]
    assert "server auth" in serving["usages"] and "client auth" not in serving["usages"]
    assert "client auth" in client["usages"] and "server auth" not in client["usages"]
    assert certs["gpupack-extender-ca"]["isCA"] is True


def hours(duration: str) -> int:
    assert duration.endswith("h"), duration
    return int(duration[:-1])


def test_certificates_renew_with_a_third_of_their_life_left(objects: list[dict[str, Any]]) -> None:
    """cert-manager renews at renewBefore (default 1/3 of duration); the extender's say so explicitly."""
    certs = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "Certificate"}
    for name in ("gpupack-extender-tls", "gpupack-scheduler-client"):
        spec = certs[name]
        assert hours(spec["renewBefore"]) * 3 == hours(spec["duration"]) == 365 * 24, name
    # the webhook's serving certificate: cert-manager's default renewBefore is 1/3 of the duration
    assert hours(certs["gpupack-webhook"]["duration"]) == 365 * 24


def test_cert_manager_is_the_default_certificate_source() -> None:
    values = yaml.safe_load(VALUES.read_text())
    assert values["webhook"]["certs"]["mode"] == "certManager"
    assert values["extender"]["certs"]["mode"] == ""  # follows the webhook's


def test_network_policy_admits_only_the_scheduler_and_prometheus(objects: list[dict[str, Any]]) -> None:
    policy = find(objects, "NetworkPolicy", "gpupack-extender")["spec"]
    extender = find(objects, "Deployment", "gpupack-extender")
    scheduler = find(objects, "Deployment", "gpupack-scheduler")
    assert policy["podSelector"] == extender["spec"]["selector"]
    assert policy["policyTypes"] == ["Ingress"]
    by_port = {r["ports"][0]["port"]: r["from"] for r in policy["ingress"]}
    assert set(by_port) == {"https", "metrics"}
    assert by_port["https"] == [{"podSelector": scheduler["spec"]["selector"]}]
    assert by_port["metrics"] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    ]
    # the scheduler pods carry the labels the policy selects
    labels = scheduler["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in scheduler["spec"]["selector"]["matchLabels"].items())
