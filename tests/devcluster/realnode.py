"""A real kubelet node next to the kwok ones: its configuration files as data (started by kubeletnode.py).

What each setting is for was found by running a kubelet (v1.34.10 and v1.37.2) with Debian's containerd
1.6.20, runc and CNI plugins against a dev cluster on this project's machine kind: Debian 12, hybrid
cgroup v1, root without CAP_SYS_RESOURCE, no registry. Every one of them failed the node without it.
"""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
DEFAULT_SUBNET = "10.250.0.0/24"  # the real node's pod network; its first host is the node IP
NODE_TAINT = {"key": "gpupack.test/real-node", "value": "true", "effect": "NoSchedule"}
HANDLER = "gpupack"  # the chart's nodeSide.handler
HANDLER_BINARY = "gpupack-runc"
# The node's default runtime: gpupack's guard once the chart installed it (nodeSide.guard), runc before
# and after (docs/node-side.md, "The guard").
GUARD = "gpupack-guard"
GUARD_BINARY = "gpupack-runc-guard"
GUARD_POD_ANNOTATIONS = ("gpupack.io/gpu-uuids",)  # what containerd passes into each container's spec


@dataclass(frozen=True)
class NodePaths:
    """Everything of one real node lives under `root` (removed whole by a teardown after unmounting)."""

    root: Path

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def runc_root(self) -> Path:
        """runc's state (default /run/containerd/runc, shared with any other containerd on the host)."""
        return self.root / "containerd" / "runc"

    @property
    def handler_dir(self) -> Path:
        """Where the chart installs the runtime handler (nodeSide.installDir): containerd's BinaryName."""
        return self.root / "gpupack" / "bin"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni"

    @property
    def cni_ipam_dir(self) -> Path:
        """host-local's leases (default /var/lib/cni/networks, outside anything a teardown removes)."""
        return self.root / "cni-ipam"

    @property
    def images(self) -> Path:
        """Docker-archive tarballs imported into containerd."""
        return self.root / "images"

    @property
    def kubeconfig(self) -> Path:
        """The kubelet's kubeconfig: its own client certificate (system:node:<name>, group system:nodes)."""
        return self.root / "kubelet.kubeconfig"

    @property
    def kubelet_root(self) -> Path:
        """--root-dir; the kubelet makes it a mount point, so a teardown must unmount it."""
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"


def _toml_str(value: str | Path) -> str:
    return json.dumps(str(value))  # a JSON string with no control characters is a TOML basic string


def containerd_config(paths: NodePaths, sandbox_image: str, cni_bin_dir: Path = CNI_BIN_DIR) -> str:
    """containerd 1.6 config (version 2): private root/state/socket, CRI with a local sandbox image."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join(
        [
            "version = 2",
            f"root = {_toml_str(paths.containerd_root)}",
            f"state = {_toml_str(paths.containerd_state)}",
            "[grpc]",
            f"  address = {_toml_str(paths.containerd_socket)}",
            f"[{cri}]",
            # No registry: the pause image is imported, never pulled.
            f"  sandbox_image = {_toml_str(sandbox_image)}",
            # The kubelet asks for oom_score_adj -998 on sandboxes; a root without CAP_SYS_RESOURCE cannot
            # lower it, and runc then fails every sandbox with only "can't get final child's PID from pipe".
            "  restrict_oom_score_adj = true",
            # Sandbox network namespaces under our state dir, not /var/run/netns: a teardown unmounts
            # everything under the node's root and nothing of the node is left elsewhere.
            "  netns_mounts_under_state_dir = true",
            # Node preparation for the guard: every container not under another RuntimeClass is created by
            # <handler dir>/gpupack-runc-guard, a link to runc until the chart puts the guard there.
            f"[{cri}.containerd]",
            f"  default_runtime_name = {_toml_str(GUARD)}",
            f"[{cri}.cni]",
            f"  bin_dir = {_toml_str(cni_bin_dir)}",
            f"  conf_dir = {_toml_str(paths.cni_conf_dir)}",
            f"[{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri}.containerd.runtimes.runc.options]",
            f"  Root = {_toml_str(paths.runc_root)}",
            # Node preparation for gpupack's RuntimeClass (docs/node-side.md): containerd 1.6 reads runtime
            # handlers only at start, so the handler is declared here before the chart installs its binary.
            f"[{cri}.containerd.runtimes.{HANDLER}]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri}.containerd.runtimes.{HANDLER}.options]",
            f"  BinaryName = {_toml_str(paths.handler_dir / HANDLER_BINARY)}",
            f"  Root = {_toml_str(paths.runc_root)}",
            f"[{cri}.containerd.runtimes.{GUARD}]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"  pod_annotations = [{', '.join(_toml_str(a) for a in GUARD_POD_ANNOTATIONS)}]",
            f"[{cri}.containerd.runtimes.{GUARD}.options]",
            f"  BinaryName = {_toml_str(paths.handler_dir / GUARD_BINARY)}",
            f"  Root = {_toml_str(paths.runc_root)}",
            "",
        ]
    )


def network_name(bridge: str) -> str:
    """The CNI network of `bridge`; libcni names its cached results <network>-<sandbox id>-<ifname>."""
    return f"gpupack-{bridge}"


def cni_conflist(bridge: str, subnet: str, ipam_dir: Path) -> dict[str, Any]:
    """One bridge network on a private subnet; its gateway (first host) is the node's IP, see node_ip."""
    net = ipaddress.ip_network(subnet)
    if net.version != 4 or not net.is_private or net.prefixlen > 29:
        raise ValueError(f"subnet={subnet!r}: must be a private IPv4 network of /29 or larger")
    if not 1 <= len(bridge) <= 15:
        raise ValueError(f"bridge={bridge!r}: must be 1 to 15 characters (a Linux interface name)")
    return {
        "cniVersion": "0.4.0",
        "name": network_name(bridge),
        # containerd sets up the pod's loopback itself; the chain configures eth0 only.
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [[{"subnet": str(net)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }


def node_ip(subnet: str) -> str:
    """The bridge's gateway address: where the kubelet listens and what the apiserver dials for logs/exec.

    Not 127.0.0.1: the kubelet drops a loopback --node-ip from the Node's addresses ("nodeIP can't be loopback
    address"), and then `kubectl logs/exec` has no address to reach it. The bridge must exist with this
    address before the kubelet starts (it binds there), and the apiserver needs
    --kubelet-preferred-address-types=InternalIP,Hostname (the node's hostname resolves nowhere).
    """
    return str(next(ipaddress.ip_network(subnet).hosts()))


def apiserver_flags(kubelet_client_cert: Path, kubelet_client_key: Path) -> tuple[str, ...]:
    """What kube-apiserver adds to reach a real kubelet for `kubectl logs/exec/port-forward`.

    The client certificate (signed by the CA in the kubelet's x509.clientCAFile) names a user that needs
    a ClusterRoleBinding to the bootstrap ClusterRole system:kubelet-api-admin (the kubelet asks the
    apiserver with a SubjectAccessReview). The node's hostname resolves nowhere: dial its InternalIP first.
    """
    return (
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--kubelet-client-certificate={kubelet_client_cert}",
        f"--kubelet-client-key={kubelet_client_key}",
    )


def kubelet_config(
    paths: NodePaths, *, address: str, port: int, healthz_port: int, client_ca_file: Path
) -> dict[str, Any]:
    """KubeletConfiguration for this machine kind (see the module docstring).

    Its API takes client certificates of `client_ca_file` (the apiserver's, see apiserver_flags) and asks
    the apiserver whether the caller may (TokenReview, SubjectAccessReview); anonymous calls get 401.
    """
    ip = ipaddress.ip_address(address)
    if ip.is_loopback or ip.is_unspecified:
        raise ValueError(f"address={address!r}: must be the node's own non-loopback IP (see node_ip)")
    for field, value in (("port", port), ("healthz_port", healthz_port)):
        if not 1 <= value <= 65535:
            raise ValueError(f"{field}={value!r}: must be a TCP port (1..65535)")
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # containerd 1.6 lacks the CRI RuntimeConfig call, so the kubelet uses its own driver setting.
        "cgroupDriver": "cgroupfs",
        # Hybrid cgroup v1 here; from v1.35 the kubelet refuses to start on v1 unless this is false.
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        # The disk is shared with everything else on the machine: no evictions, no image GC.
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "resolvConf": "",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "podLogsDir": str(paths.pod_logs),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        # Only pods that tolerate it land here; every other test pod stays on kwok nodes.
        "registerWithTaints": [dict(NODE_TAINT)],
    }


def docker_archive(tag: str, files: dict[str, bytes], links: dict[str, str], config: dict[str, Any]) -> bytes:
    """A one-layer image in docker-archive form (what `ctr images import` reads), built without a registry.

    `files`: path -> content (executable); `links`: path -> symlink target; `config`: the image config's
    `config` (Entrypoint, Cmd, Env).
    """
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        dirs = sorted({str(Path(p).parent) for p in [*files, *links]} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted(links.items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    layer_bytes = layer.getvalue()
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()]},
    }
    manifest = [{"Config": "config.json", "RepoTags": [tag], "Layers": ["layer.tar"]}]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in (
            ("layer.tar", layer_bytes),
            ("config.json", json.dumps(image_config).encode()),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def busybox_images(busybox: bytes) -> dict[str, bytes]:
    """The sandbox ("pause") image and a shell image from one static busybox (Debian's busybox-static)."""
    applets = ("sh", "sleep", "env", "cat", "ls", "id")
    files = {"bin/busybox": busybox}
    links = {f"bin/{a}": "busybox" for a in applets}
    env = ["PATH=/bin"]
    return {
        "localhost/pause:1": docker_archive(
            "localhost/pause:1", files, links, {"Entrypoint": ["/bin/sleep", "2147483647"], "Env": env}
        ),
        "localhost/busybox:1": docker_archive(
            "localhost/busybox:1", files, links, {"Cmd": ["/bin/sh"], "Env": env}
        ),
    }
