"""Dev cluster: scheduler config rendering, identities/tokens/kubeconfigs, component argv, ports."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.core import names
from tests.devcluster import components, identities, ports, schedconfig
from tests.devcluster.binaries import repo_root
from tests.devcluster.layout import Layout, Ports

TEMPLATE = (repo_root() or Path(".")) / schedconfig.TEMPLATE_RELPATH


def _render(**kw: Any) -> dict[str, Any]:
    return schedconfig.render(
        TEMPLATE.read_text(),
        kubeconfig="/d/kubeconfigs/scheduler.kubeconfig",
        extender_url="https://127.0.0.1:23456",
        tls=schedconfig.ExtenderTLS(
            "/d/pki/ca.crt", "/d/pki/scheduler-client.crt", "/d/pki/scheduler-client.key"
        ),
        **kw,
    )


def test_scheduler_config_extender_entry_is_exactly_the_contract() -> None:
    doc = _render()
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert doc["clientConnection"] == {"kubeconfig": "/d/kubeconfigs/scheduler.kubeconfig"}
    (ext,) = doc["extenders"]
    assert ext == {
        "urlPrefix": "https://127.0.0.1:23456",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "weight": 5,
        # mutual TLS: the extender answers only the scheduler's client certificate
        "enableHTTPS": True,
        "tlsConfig": {
            "caFile": "/d/pki/ca.crt",
            "certFile": "/d/pki/scheduler-client.crt",
            "keyFile": "/d/pki/scheduler-client.key",
        },
        "nodeCacheCapable": True,
        "httpTimeout": "5s",
        "ignorable": False,
        "managedResources": [
            {"name": names.RESOURCE_GPU_MILLI, "ignoredByScheduler": False},
            {"name": names.RESOURCE_GPU_MEMORY_MIB, "ignoredByScheduler": False},
            # quota-only: no node advertises them, so NodeResourcesFit must not count them
            {"name": names.RESOURCE_QUOTA_GPU_MILLI, "ignoredByScheduler": True},
            {"name": names.RESOURCE_QUOTA_GPU_MEMORY_MIB, "ignoredByScheduler": True},
        ],
    }


def test_scheduler_config_test_overrides_are_merged_not_replacing() -> None:
    doc = _render()
    assert doc["podInitialBackoffSeconds"] == 1
    assert doc["podMaxBackoffSeconds"] == 2
    assert doc["leaderElection"] == {"leaderElect": False}
    assert doc["profiles"] == [{"schedulerName": "default-scheduler"}]


def test_scheduler_config_without_overrides_is_the_production_shape() -> None:
    doc = _render(overrides={})
    assert doc["leaderElection"] == {"leaderElect": True}
    assert "podMaxBackoffSeconds" not in doc


def test_scheduler_config_rejects_unknown_placeholders() -> None:
    with pytest.raises(KeyError, match="NOPE"):
        schedconfig.render(
            "kind: KubeSchedulerConfiguration\nx: ${NOPE}\n",
            kubeconfig="",
            extender_url="",
            tls=schedconfig.CHART_TLS,
        )


def test_token_csv_rows_and_groups() -> None:
    tokens = {i.key: f"tok-{i.key}" for i in identities.IDENTITIES}
    rows = identities.token_csv(tokens).splitlines()
    assert rows[0] == 'tok-admin,admin,uid-admin,"system:masters"'
    assert "tok-scheduler,system:kube-scheduler,uid-scheduler" in rows
    assert (
        "tok-gpupack-agent,system:serviceaccount:gpupack-system:gpupack-agent,uid-gpupack-agent,"
        '"system:serviceaccounts,system:serviceaccounts:gpupack-system"'
    ) in rows
    assert 'tok-tenant,tenant,uid-tenant,"tenants"' in rows
    assert "tok-controller-manager,system:kube-controller-manager,uid-controller-manager" in rows
    assert len(rows) == len(identities.IDENTITIES) == 8


def test_new_tokens_are_distinct_and_csv_safe() -> None:
    tokens = identities.new_tokens()
    assert set(tokens) == set(identities.IDENTITY_KEYS)
    assert len(set(tokens.values())) == len(tokens)
    assert not any(c in t for t in tokens.values() for c in ',"\n ')


def test_kubeconfig_points_at_server_ca_and_token() -> None:
    doc = identities.kubeconfig("https://127.0.0.1:1234", "/d/pki/ca.crt", "admin", "t0k")
    ctx = doc["contexts"][0]["context"]
    assert doc["current-context"] == doc["contexts"][0]["name"]
    assert doc["clusters"][0]["cluster"] == {
        "server": "https://127.0.0.1:1234",
        "certificate-authority": "/d/pki/ca.crt",
    }
    assert doc["users"][0] == {"name": ctx["user"], "user": {"token": "t0k"}}
    assert yaml.safe_load(yaml.safe_dump(doc)) == doc


PORTS = Ports(
    etcd=1, etcd_peer=2, apiserver=3, scheduler=4, kwok=5, extender=6, webhook=7, extender_ops=8,
    controller_manager=9,
)  # fmt: skip


def test_control_plane_order_and_flags(tmp_path: Path) -> None:
    specs = components.control_plane(Path("/bin"), Layout(tmp_path), PORTS)
    assert [s.name for s in specs] == list(components.CONTROL_PLANE)
    etcd, api, kcm, sched, kwok = specs
    assert "--listen-client-urls=http://127.0.0.1:1" in etcd.argv
    assert "--initial-cluster=default=http://127.0.0.1:2" in etcd.argv
    assert etcd.health is not None and etcd.health.url == "http://127.0.0.1:1/health"
    assert "--etcd-servers=http://127.0.0.1:1" in api.argv
    assert "--secure-port=3" in api.argv
    assert "--authorization-mode=RBAC" in api.argv
    assert "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition" in api.argv
    assert f"--token-auth-file={tmp_path / 'tokens.csv'}" in api.argv
    assert api.health is not None and api.health.token is None  # nothing secret is recorded in state.json
    assert f"--kubeconfig={tmp_path / 'kubeconfigs' / 'controller-manager.kubeconfig'}" in kcm.argv
    assert "--controllers=*" in kcm.argv
    assert kcm.health is not None and kcm.health.url == "https://127.0.0.1:9/healthz"
    assert f"--config={tmp_path / 'kube-scheduler-config.yaml'}" in sched.argv
    assert sched.health is not None and sched.health.url == "https://127.0.0.1:4/readyz"
    assert "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake" in kwok.argv
    assert "--server-address=127.0.0.1:5" in kwok.argv


@pytest.mark.parametrize(
    ("lease_s", "renewed_every_s", "grace"),
    [(None, 10, "50s"), (600, 150, "610s")],
    ids=["kubelet-default", "long-lease-for-scale"],
)
def test_fake_nodes_stay_reachable_for_their_lease(
    tmp_path: Path, lease_s: int | None, renewed_every_s: int, grace: str
) -> None:
    """kwok renews each node's lease every quarter of it; the node lifecycle controller must wait longer."""
    kw = {} if lease_s is None else {"node_lease_s": lease_s}
    _, _, kcm, _, kwok = components.control_plane(Path("/bin"), Layout(tmp_path), PORTS, **kw)
    lease = int(_flag(kwok.argv, "node-lease-duration-seconds"))
    assert lease // 4 == renewed_every_s
    assert _flag(kcm.argv, "node-monitor-grace-period") == grace
    assert int(grace.rstrip("s")) > lease  # a node is never marked unreachable while its lease holds


def _flag(argv: tuple[str, ...], name: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    assert len(values) == 1, f"--{name} given {len(values)} times in {argv}"
    return values[0]


def test_controller_manager_signs_tokens_with_the_key_the_apiserver_checks(tmp_path: Path) -> None:
    """Token controller and apiserver must agree on the ServiceAccount key pair, and both trust one CA."""
    layout = Layout(tmp_path)
    api = components.apiserver(Path("/bin"), layout, PORTS)
    kcm = components.controller_manager(Path("/bin"), layout, PORTS)
    signing_key = _flag(api.argv, "service-account-signing-key-file")
    assert _flag(kcm.argv, "service-account-private-key-file") == signing_key == str(layout.pki.sa_key)
    assert _flag(api.argv, "service-account-key-file") == str(layout.pki.sa_pub)
    assert _flag(kcm.argv, "root-ca-file") == _flag(api.argv, "client-ca-file") == str(layout.pki.ca.cert)
    assert _flag(kcm.argv, "cluster-signing-key-file") == str(layout.pki.ca.key)
    assert _flag(kcm.argv, "tls-cert-file") == str(layout.pki.controller_manager.cert)
    assert _flag(kcm.argv, "secure-port") == "9"
    # kubeadm's shape: every controller acts as its own ServiceAccount, bound by the bootstrap RBAC roles.
    assert _flag(kcm.argv, "use-service-account-credentials") == "true"


def test_controller_manager_identity_is_the_bootstrap_rbac_user() -> None:
    """The bootstrap ClusterRoleBinding system:kube-controller-manager names exactly this user."""
    ident = {i.key: i for i in identities.IDENTITIES}["controller-manager"]
    assert ident.user == "system:kube-controller-manager"
    assert ident.groups == ()  # no system:masters: RBAC is a moving part here, as in a real cluster


def test_layout_generated_paths_stay_inside_the_directory(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert all(p.is_relative_to(tmp_path) and p != tmp_path for p in layout.generated())
    assert layout.kubeconfig_for("admin") == tmp_path / "kubeconfig"
    assert layout.kubeconfig_for("kwok") == tmp_path / "kubeconfigs" / "kwok.kubeconfig"
    assert Ports.from_json(PORTS.to_json()) == PORTS


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    got = ports.free_ports(7)
    assert len(set(got)) == 7
    assert all(20000 <= p < ports._ephemeral_start() for p in got)
    for port in got:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
