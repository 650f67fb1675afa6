"""The real node's lifecycle pieces that need no root: RBAC bodies, readiness, state, the bridge's names."""

from __future__ import annotations

from pathlib import Path

from tests.devcluster import kubeletnode, pki, realnode


def test_kubelet_and_apiserver_get_exactly_the_bootstrap_roles_they_need() -> None:
    got = {b["roleRef"]["name"]: b["subjects"] for b in kubeletnode.bindings("n1")}
    assert got == {
        "system:node": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:node:n1"}],
        "system:kubelet-api-admin": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": pki.KUBELET_CLIENT_USER}
        ],
    }


def test_node_ready_reads_the_ready_condition_only() -> None:
    ready = {
        "status": {
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}]
        }
    }
    assert kubeletnode.node_ready(ready)
    assert not kubeletnode.node_ready({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert not kubeletnode.node_ready({})  # not registered yet


def test_recorded_node_round_trips_through_state_json() -> None:
    node = kubeletnode.RealNode("n1", Path("/tmp/dev/realnode/n1"), "br-x", "10.251.0.0/24")
    assert kubeletnode.RealNode.from_json(node.to_json()) == node
    assert node.ip == "10.251.0.1"
    assert (
        node.network == "gpupack-br-x"
    )  # the name cni_conflist gives the network, libcni's cache key prefix
    assert realnode.cni_conflist(node.bridge, node.subnet, node.paths.cni_ipam_dir)["name"] == node.network


def test_process_names_are_per_node() -> None:
    a = kubeletnode.RealNode("a", Path("/x/a"))
    names = {a.containerd_process, a.kubelet_process, a.relay_process}
    assert len(names) == 3 and all(n.endswith("-a") for n in names)


def test_apiserver_certificate_names_the_default_node_ip() -> None:
    assert realnode.node_ip(realnode.DEFAULT_SUBNET) in pki.APISERVER_SANS
