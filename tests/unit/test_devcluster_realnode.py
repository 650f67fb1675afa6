"""Real-node configuration: what containerd, the CNI bridge and the kubelet need on this machine kind."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
import tomllib
from pathlib import Path

import pytest

from tests.devcluster import realnode
from tests.devcluster.realnode import NodePaths

PATHS = NodePaths(Path("/tmp/gpupack-node"))
SUBNET = "10.88.77.0/24"


def test_containerd_config_is_toml_with_private_paths_and_the_oom_setting() -> None:
    conf = tomllib.loads(realnode.containerd_config(PATHS, "localhost/pause:1"))
    assert conf["version"] == 2
    assert conf["grpc"]["address"] == str(PATHS.containerd_socket)
    # Nothing of the host's containerd (/var/lib/containerd, /run/containerd) is shared.
    for key in ("root", "state"):
        assert Path(conf[key]).is_relative_to(PATHS.root)
    cri = conf["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "localhost/pause:1"
    assert cri["restrict_oom_score_adj"] is True
    assert cri["cni"] == {"bin_dir": "/usr/lib/cni", "conf_dir": str(PATHS.cni_conf_dir)}
    assert cri["containerd"]["runtimes"]["runc"]["runtime_type"] == "io.containerd.runc.v2"
    # Sandbox netns and runc state under the node's root too: a teardown finds every mount there.
    assert cri["netns_mounts_under_state_dir"] is True
    assert Path(cri["containerd"]["runtimes"]["runc"]["options"]["Root"]).is_relative_to(PATHS.root)


def test_containerd_config_makes_the_guard_the_default_runtime_with_runcs_options() -> None:
    runtimes = tomllib.loads(realnode.containerd_config(PATHS, "localhost/pause:1"))["plugins"][
        "io.containerd.grpc.v1.cri"
    ]["containerd"]
    assert runtimes["default_runtime_name"] == "gpupack-guard"
    guard = runtimes["runtimes"]["gpupack-guard"]
    assert guard["options"] == {
        "BinaryName": str(PATHS.handler_dir / "gpupack-runc-guard"),
        "Root": runtimes["runtimes"]["runc"]["options"]["Root"],
    }
    # The allocation reaches the guard: a gpupack pod outside the RuntimeClass keeps its GPUs.
    assert guard["pod_annotations"] == ["gpupack.io/gpu-uuids"]


def test_containerd_config_quotes_paths_it_is_given() -> None:
    odd = NodePaths(Path('/tmp/a "b"\\c'))
    conf = tomllib.loads(realnode.containerd_config(odd, "localhost/pause:1"))
    assert conf["root"] == str(odd.containerd_root)


def test_cni_bridge_gateway_is_the_node_ip_inside_the_subnet() -> None:
    conf = realnode.cni_conflist("gpk0", SUBNET, PATHS.cni_ipam_dir)
    (bridge,) = conf["plugins"]
    assert (bridge["type"], bridge["bridge"], bridge["isGateway"]) == ("bridge", "gpk0", True)
    assert bridge["ipam"]["ranges"] == [[{"subnet": SUBNET}]]
    assert bridge["ipam"]["dataDir"] == str(PATHS.cni_ipam_dir)
    ip = realnode.node_ip(SUBNET)
    assert ip == "10.88.77.1"
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(SUBNET)


@pytest.mark.parametrize(
    ("bridge", "subnet", "message"),
    [
        ("gpk0", "8.8.8.0/24", "subnet='8.8.8.0/24': must be a private IPv4 network of /29 or larger"),
        ("gpk0", "10.0.0.0/30", "subnet='10.0.0.0/30': must be a private IPv4 network of /29 or larger"),
        ("gpk0", "fd00::/64", "subnet='fd00::/64': must be a private IPv4 network of /29 or larger"),
        ("a-very-long-bridge", SUBNET, "bridge='a-very-long-bridge': must be 1 to 15 characters"),
    ],
    ids=["public", "too-small", "ipv6", "long-name"],
)
def test_cni_conflist_refuses_bad_networks(bridge: str, subnet: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        realnode.cni_conflist(bridge, subnet, PATHS.cni_ipam_dir)


def test_kubelet_config_for_hybrid_cgroup_v1_and_a_shared_disk() -> None:
    conf = realnode.kubelet_config(
        PATHS, address="10.88.77.1", port=31750, healthz_port=31751, client_ca_file=Path("/pki/ca.crt")
    )
    assert (conf["cgroupDriver"], conf["failCgroupV1"], conf["failSwapOn"]) == ("cgroupfs", False, False)
    assert conf["containerRuntimeEndpoint"] == f"unix://{PATHS.containerd_socket}"
    assert conf["evictionHard"] == {}
    assert conf["imageGCHighThresholdPercent"] == 100
    assert (conf["address"], conf["port"], conf["readOnlyPort"]) == ("10.88.77.1", 31750, 0)
    assert conf["registerWithTaints"] == [realnode.NODE_TAINT]
    assert Path(conf["podLogsDir"]).is_relative_to(PATHS.root)
    # Not opened wide: only the apiserver's client certificate, authorized by the apiserver.
    assert conf["authentication"]["anonymous"] == {"enabled": False}
    assert conf["authentication"]["x509"] == {"clientCAFile": "/pki/ca.crt"}
    assert conf["authorization"] == {"mode": "Webhook"}


def test_apiserver_dials_the_kubelet_by_ip_with_its_client_certificate() -> None:
    flags = realnode.apiserver_flags(Path("/pki/kc.crt"), Path("/pki/kc.key"))
    assert flags[0] == "--kubelet-preferred-address-types=InternalIP,Hostname"
    assert set(flags[1:]) == {"--kubelet-client-certificate=/pki/kc.crt", "--kubelet-client-key=/pki/kc.key"}


@pytest.mark.parametrize(
    ("address", "port", "message"),
    [
        ("127.0.0.1", 31750, "address='127.0.0.1': must be the node's own non-loopback IP"),
        ("0.0.0.0", 31750, "address='0.0.0.0': must be the node's own non-loopback IP"),
        ("10.88.77.1", 0, "port=0: must be a TCP port"),
        ("10.88.77.1", 70000, "port=70000: must be a TCP port"),
    ],
)
def test_kubelet_config_refuses_what_breaks_logs_and_exec(address: str, port: int, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        realnode.kubelet_config(
            PATHS, address=address, port=port, healthz_port=31751, client_ca_file=Path("/pki/ca.crt")
        )


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_docker_archive_is_self_consistent() -> None:
    """What `ctr images import` checks: the manifest names the config and layer; diff_id = sha256(layer)."""
    images = realnode.busybox_images(b"\x7fELF fake busybox")
    assert set(images) == {"localhost/pause:1", "localhost/busybox:1"}
    for tag, archive in images.items():
        members = _members(archive)
        (manifest,) = json.loads(members["manifest.json"])
        assert manifest["RepoTags"] == [tag]
        config = json.loads(members[manifest["Config"]])
        (layer_name,) = manifest["Layers"]
        layer = members[layer_name]
        assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            busybox = tar.getmember("bin/busybox")
            assert busybox.mode & 0o111 and tar.extractfile(busybox).read() == b"\x7fELF fake busybox"  # type: ignore[union-attr]
            sleep = tar.getmember("bin/sleep")
            assert sleep.issym() and sleep.linkname == "busybox"
    pause = json.loads(_members(images["localhost/pause:1"])["config.json"])["config"]
    assert pause["Entrypoint"][0] == "/bin/sleep"  # the sandbox only has to stay alive
