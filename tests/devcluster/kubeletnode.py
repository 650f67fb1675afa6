"""Start and stop one real kubelet node (containerd + kubelet) in a dev cluster, from realnode.py's data.

`start` needs root (a bridge, mounts, cgroups) and Debian's containerd, runc, containernetworking-plugins and
busybox-static (.ci/system-deps installs them); `missing_prerequisites` says what is absent. Everything of
the node lives under DIR/realnode/<name>/ except three things the kernel keeps elsewhere, which `stop`
removes by name: the CNI bridge, the kubelet's `kubepods` cgroups, and containerd's shim processes (found by
the node's containerd socket on their command line). `stop` works from state.json alone, so `make
down` in another shell cleans up a node that `dev up` started, and it finishes every step even when one
fails, then names what it could not remove.

The node's IP is the bridge's gateway address (realnode.node_ip): the kubelet listens there, the apiserver
dials it for logs/exec. The apiserver itself listens on 127.0.0.1 only, so a relay (relay.py) at the node IP
forwards to it: pods on the node's bridge reach the API there (see README, "A real node").
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from app.core import names
from app.core.errors import KubeError
from app.kube.calls import MERGE_PATCH, Request
from app.kube.client import Kube
from app.service import certs

from . import realnode
from .pki import KUBELET_CLIENT_USER
from .poll import wait_for
from .ports import free_ports
from .processes import ComponentSpec, HealthCheck, pid_alive

if TYPE_CHECKING:
    from .cluster import Cluster

Progress = Callable[[str], None]

DEFAULT_NAME = "gpupack-real-node"
DEFAULT_BRIDGE = "gpupack-br0"
PAUSE_IMAGE = "localhost/pause:1"
BUSYBOX_IMAGE = "localhost/busybox:1"
BUSYBOX = Path("/bin/busybox")  # busybox-static
CNI_PLUGINS = ("bridge", "host-local", "loopback")
NAMESPACE = "k8s.io"  # containerd's namespace for CRI (kubelet) containers and images
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Paths the kubelet and libcni use whatever they are told: the device-plugin registration socket, and
# libcni's cache of each attachment's result (removed by a CNI DEL, which a killed pod never gets).
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
CNI_RESULTS_DIR = Path("/var/lib/cni/results")
KUBEPODS = "kubepods"
META_KEY = "real_node"
# One real node per machine: its name, bridge, cgroup root and CNI files are fixed, so a second one at the
# same time (another checkout's test run or dev cluster) would take the first one's containers down. A test
# run holds MACHINE_LOCK for its life; a dev cluster, whose processes outlive the command that started them,
# records itself in MACHINE_OWNER (its containerd) until `down`.
MACHINE_LOCK = Path("/tmp/gpupack-real-node.lock")
MACHINE_OWNER = Path("/tmp/gpupack-real-node.owner.json")
TAINT_KEY = str(realnode.NODE_TAINT["key"])


def _quiet(_: str) -> None:
    pass


class RealNodeError(RuntimeError):
    """The real node could not start or be cleaned up; the message says which step and what is left."""


@dataclass(frozen=True)
class RealNode:
    """One real node of a cluster: its name, network and directory (DIR/realnode/<name>)."""

    name: str
    root: Path
    bridge: str = DEFAULT_BRIDGE
    subnet: str = realnode.DEFAULT_SUBNET

    @property
    def paths(self) -> realnode.NodePaths:
        return realnode.NodePaths(self.root)

    @property
    def ip(self) -> str:
        return realnode.node_ip(self.subnet)

    @property
    def network(self) -> str:
        return realnode.network_name(self.bridge)

    @property
    def containerd_process(self) -> str:
        return f"containerd-{self.name}"

    @property
    def relay_process(self) -> str:
        return f"relay-{self.name}"

    @property
    def kubelet_process(self) -> str:
        return f"kubelet-{self.name}"

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "root": str(self.root), "bridge": self.bridge, "subnet": self.subnet}

    @classmethod
    def from_json(cls, raw: dict[str, str]) -> RealNode:
        return cls(raw["name"], Path(raw["root"]), raw["bridge"], raw["subnet"])

    @classmethod
    def of(cls, cluster: Cluster, name: str = DEFAULT_NAME) -> RealNode:
        return cls(name, cluster.dir / "realnode" / name)


def missing_prerequisites(bin_dir: Path) -> list[str]:
    """What `start` needs and cannot find: 'root' (no installer gives it), or a named file/package."""
    out = [] if os.geteuid() == 0 else ["root (bridge, mounts and cgroups need it)"]
    for tool, package in (
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("runc", "runc"),
        ("ip", "iproute2"),
    ):
        if shutil.which(tool) is None:
            out.append(f"{tool} (Debian package {package})")
    out += [
        f"{realnode.CNI_BIN_DIR / p} (Debian package containernetworking-plugins)"
        for p in CNI_PLUGINS
        if not (realnode.CNI_BIN_DIR / p).is_file()
    ]
    if not BUSYBOX.is_file():
        out.append(f"{BUSYBOX} (Debian package busybox-static)")
    if not os.access(bin_dir / "kubelet", os.X_OK):
        out.append(f"{bin_dir / 'kubelet'} (tests/k8s/build.sh builds it)")
    return out


def _run(argv: Sequence[str], what: str) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RealNodeError(
            f"{what}: {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}"
        )
    return proc.stdout


def _ctr(node: RealNode, *args: str) -> list[str]:
    return ["ctr", "--address", str(node.paths.containerd_socket), "--namespace", NAMESPACE, *args]


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def write_files(cluster: Cluster, node: RealNode, port: int, healthz_port: int) -> None:
    """containerd, CNI and kubelet configuration, the kubelet's client certificate and kubeconfig, images."""
    paths = node.paths
    for d in (paths.containerd_root, paths.containerd_state, paths.cni_conf_dir, paths.kubelet_root):
        d.mkdir(parents=True, exist_ok=True)
    _write(paths.containerd_config, realnode.containerd_config(paths, PAUSE_IMAGE))
    # Node preparation for the guard: its path links to the node's runc until the chart installs it.
    paths.handler_dir.mkdir(parents=True, exist_ok=True)
    guard = paths.handler_dir / realnode.GUARD_BINARY
    if not guard.is_symlink() and not guard.exists():
        guard.symlink_to(shutil.which("runc") or "/usr/sbin/runc")
    conflist = realnode.cni_conflist(node.bridge, node.subnet, paths.cni_ipam_dir)
    _write(paths.cni_conf_dir / "10-gpupack.conflist", json.dumps(conflist, indent=2) + "\n")
    pki = cluster.layout.pki
    kubelet = realnode.kubelet_config(
        paths, address=node.ip, port=port, healthz_port=healthz_port, client_ca_file=pki.ca.cert
    )
    _write(paths.kubelet_config, yaml.safe_dump(kubelet, sort_keys=False))
    ca = certs.Pem(pki.ca.cert.read_bytes(), pki.ca.key.read_bytes())
    cert_file, key_file = paths.root / "kubelet-client.crt", paths.root / "kubelet-client.key"
    certs.write_pem(
        certs.new_client_cert(ca, f"system:node:{node.name}", organizations=("system:nodes",)),
        cert_file,
        key_file,
    )
    _write(
        paths.kubeconfig, yaml.safe_dump(_kubeconfig(cluster, cert_file, key_file), sort_keys=False), 0o600
    )
    paths.images.mkdir(parents=True, exist_ok=True)
    for tag, archive in realnode.busybox_images(BUSYBOX.read_bytes()).items():
        (paths.images / f"{tag.rsplit('/', 1)[-1].replace(':', '-')}.tar").write_bytes(archive)


def _kubeconfig(cluster: Cluster, cert: Path, key: Path) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "dev",
                "cluster": {"server": cluster.api_url, "certificate-authority": str(cluster.ca_file)},
            }
        ],
        "users": [{"name": "kubelet", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "kubelet"}}],
        "current-context": "dev",
    }


def bindings(node_name: str) -> list[dict[str, object]]:
    """The kubelet's user may do what a node does (system:node); the apiserver may call the kubelet API."""

    def binding(name: str, role: str, user: str) -> dict[str, object]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }

    return [
        binding(f"gpupack-dev:node:{node_name}", "system:node", f"system:node:{node_name}"),
        binding("gpupack-dev:apiserver-kubelet-client", "system:kubelet-api-admin", KUBELET_CLIENT_USER),
    ]


def _create_all(kube: Kube, path: str, bodies: Iterable[dict[str, object]]) -> None:
    for body in bodies:
        try:
            kube.send(Request("POST", path, body))
        except KubeError as exc:
            if exc.code != 409:  # already there from an earlier start: same content
                raise


def node_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def as_gpu_node(cluster: Cluster, node: RealNode, model: str, gpus: int) -> None:
    """Label the node with a GPU model and give it gpu-milli capacity, as the dev cluster's kwok GPU nodes
    are created, so the dev addons start a simulated agent for it (which then keeps both up to date)."""
    kube = Kube.connect(str(cluster.kubeconfig))
    try:
        path = f"/api/v1/nodes/{node.name}"
        kube.send(
            Request(
                "PATCH",
                path,
                {"metadata": {"labels": {names.NODE_LABEL_GPU_MODEL: model}}},
                content_type=MERGE_PATCH,
            )
        )
        capacity = {names.RESOURCE_GPU_MILLI: str(gpus * 1000)}
        body = {"status": {"capacity": capacity, "allocatable": capacity}}
        kube.send(Request("PATCH", f"{path}/status", body, content_type=MERGE_PATCH))
    finally:
        kube.close()


def create_bridge(node: RealNode) -> None:
    """The bridge with the node IP, before the kubelet (which binds there) and before the first pod."""
    prefix = node.subnet.split("/")[1]
    if not Path(f"/sys/class/net/{node.bridge}").exists():
        _run(["ip", "link", "add", "name", node.bridge, "type", "bridge"], "create the CNI bridge")
    addrs = _run(["ip", "-o", "-4", "addr", "show", "dev", node.bridge], "read the bridge address")
    if f" {node.ip}/" not in addrs:
        _run(["ip", "addr", "add", f"{node.ip}/{prefix}", "dev", node.bridge], "address the CNI bridge")
    _run(["ip", "link", "set", node.bridge, "up"], "bring the CNI bridge up")


def claim_machine(cluster_dir: Path, wait: bool) -> int:
    """Take this machine's real node for the cluster in `cluster_dir`: the lock (waiting for a test run that
    holds it where `wait`), then no other dev cluster's real node may be running. Returns the lock's fd: a
    test run keeps it open for its life, a dev cluster closes it once its node runs (start records it)."""
    fd = os.open(MACHINE_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if not wait:
            os.close(fd)
            raise RealNodeError(
                f"a real-node test run on this machine holds its real node ({MACHINE_LOCK}); try again when "
                "it ends"
            ) from None
        print(f"\nwaiting for the real node of another run on this machine ({MACHINE_LOCK})", file=sys.stderr)
        fcntl.flock(fd, fcntl.LOCK_EX)
    owner = machine_owner()
    if owner is not None and owner != str(cluster_dir):
        os.close(fd)
        raise RealNodeError(
            f"the dev cluster in {owner} runs this machine's real node; stop it first: "
            f"python -m tests.devcluster down --dir {owner}"
        )
    return fd


def machine_owner() -> str | None:
    """The directory of the cluster whose real node runs on this machine now (None: none, or it died)."""
    try:
        raw = json.loads(MACHINE_OWNER.read_text())
        alive = pid_alive(int(raw["pid"]), int(raw["ticks"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(raw["cluster"]) if alive else None


def _record_owner(cluster: Cluster, node: RealNode) -> None:
    proc = next(p for p in cluster.processes if p.name == node.containerd_process)
    _write(MACHINE_OWNER, json.dumps({"cluster": str(cluster.dir), "pid": proc.pid, "ticks": proc.ticks}))


def _release_owner(cluster: Cluster) -> None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if json.loads(MACHINE_OWNER.read_text())["cluster"] == str(cluster.dir):
            MACHINE_OWNER.unlink()


def start(cluster: Cluster, node: RealNode, progress: Progress = _quiet, timeout_s: float = 120) -> None:
    """containerd, the images, then the kubelet; returns once the Node is Ready. Recorded in state.json.

    On failure everything started so far is cleaned up (`stop`) before the error propagates.
    """
    missing = missing_prerequisites(cluster.bin_dir)
    if missing:
        raise RealNodeError("a real node needs: " + "; ".join(missing))
    cluster.meta[META_KEY] = node.to_json()
    cluster.save()
    try:
        _start(cluster, node, progress, timeout_s)
        _record_owner(cluster, node)
    except BaseException:
        stop(cluster, node)
        raise


def _start(cluster: Cluster, node: RealNode, progress: Progress, timeout_s: float) -> None:
    port, healthz_port = free_ports(2)
    write_files(cluster, node, port, healthz_port)
    create_bridge(node)
    paths = node.paths
    cluster.start_process(
        ComponentSpec(
            node.containerd_process,
            ("containerd", "--config", str(paths.containerd_config)),
            ready_timeout_s=30,
        ),
        progress,
    )
    wait_for(
        lambda: subprocess.run(_ctr(node, "version"), capture_output=True, check=False).returncode == 0,
        30,
        "containerd answering on its socket",
    )
    for archive in sorted(paths.images.glob("*.tar")):
        import_image(node, archive)
    start_api_relay(cluster, node, progress)
    kube = Kube.connect(str(cluster.kubeconfig))
    try:
        _create_all(kube, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", bindings(node.name))
        cluster.start_process(
            ComponentSpec(
                node.kubelet_process,
                (
                    str(cluster.bin_dir / "kubelet"),
                    f"--config={paths.kubelet_config}",
                    f"--kubeconfig={paths.kubeconfig}",
                    f"--root-dir={paths.kubelet_root}",
                    f"--hostname-override={node.name}",
                    f"--node-ip={node.ip}",
                    "--v=1",
                ),
                health=HealthCheck(f"http://127.0.0.1:{healthz_port}/healthz"),
                ready_timeout_s=90,
            ),
            progress,
        )
        progress(f"waiting for node {node.name} to be Ready")
        wait_for(
            lambda: node_ready(_get_node(kube, node.name)),
            timeout_s,
            f"node {node.name} Ready",
            interval=0.5,
        )
    finally:
        kube.close()


def start_api_relay(cluster: Cluster, node: RealNode, progress: Progress = _quiet) -> None:
    """The apiserver at the node IP, same port, for pods on the node's bridge (see relay.py)."""
    port = cluster.ports.apiserver
    cluster.start_process(
        ComponentSpec(
            node.relay_process,
            (
                sys.executable,
                "-m",
                "tests.devcluster.relay",
                "--listen",
                f"{node.ip}:{port}",
                "--to",
                f"127.0.0.1:{port}",
            ),
            health=HealthCheck(f"https://{node.ip}:{port}/readyz", ca_file=str(cluster.ca_file)),
            ready_timeout_s=30,
        ),
        progress,
    )


def _get_node(kube: Kube, name: str) -> dict[str, Any]:
    try:
        return kube.send(Request("GET", f"/api/v1/nodes/{name}"))
    except KubeError as exc:
        if exc.code == 404:
            return {}
        raise


def import_image(node: RealNode, archive: Path) -> None:
    """A docker-archive (or OCI archive) tarball into the node's containerd, where the kubelet finds it."""
    _run(_ctr(node, "images", "import", str(archive)), f"import {archive.name} into containerd")


# ---- teardown ----


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root` (from /proc/self/mountinfo), deepest first."""
    out = []
    prefix = str(root)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # octal escapes: \040 for a space
        if point == prefix or point.startswith(prefix + "/"):
            out.append(point)
    return sorted(set(out), key=lambda p: (-p.count("/"), p))


def _shims(socket: Path) -> list[int]:
    """containerd shims of this node's containerd: their argv carries `-address <socket>`."""
    out = []
    needle = str(socket).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and needle in argv:
            out.append(int(entry.name))
    return out


def _children(pid: int) -> list[int]:
    try:
        raw = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in raw.split()]


def _kill_tree(pid: int) -> None:
    for child in _children(pid):
        _kill_tree(child)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _kubepods_cgroups() -> list[Path]:
    """The kubelet's pod cgroups (cgroupfs driver) in every hierarchy, deepest first."""
    found: list[Path] = []
    for top in [*CGROUP_ROOT.glob(KUBEPODS), *CGROUP_ROOT.glob(f"*/{KUBEPODS}")]:
        if top.is_dir():
            found += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: -len(p.parts))


def _step(failures: list[str], what: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # every step runs; the failures are reported together
        failures.append(f"{what}: {type(exc).__name__}: {exc}")


def stop(cluster: Cluster, node: RealNode) -> None:
    """Stop the kubelet and containerd, kill the node's containers, unmount, delete the bridge, the pod
    cgroups, the Node object and the node's directory; raise RealNodeError naming whatever is left."""
    failures: list[str] = []
    names = {p.name for p in cluster.processes}
    ids = _container_ids(node) if node.containerd_process in names else []
    if node.kubelet_process in names:
        _step(failures, "stop the kubelet", lambda: cluster.stop_process(node.kubelet_process))
    if node.containerd_process in names:
        _step(failures, "kill the node's containers", lambda: _kill_tasks(node))
        _step(failures, "stop containerd", lambda: cluster.stop_process(node.containerd_process))
    if node.relay_process in names:
        _step(failures, "stop the API relay", lambda: cluster.stop_process(node.relay_process))
    _step(failures, "kill leftover shims", lambda: _kill_shims(node))
    _step(failures, "unmount", lambda: _unmount(node.root))
    _step(failures, "delete the bridge", lambda: _delete_bridge(node))
    _step(failures, "remove host files", lambda: _remove_host_files(node, ids))
    _step(failures, "remove pod cgroups", _remove_kubepods)
    _step(failures, "delete the Node", lambda: _delete_node(cluster, node.name))
    if node.root.exists() and not _mounts_under(node.root):
        _step(failures, "remove the node's directory", lambda: shutil.rmtree(node.root, ignore_errors=False))
    left = leftovers(node, ids)
    if not left:
        _release_owner(cluster)
    cluster.meta.pop(META_KEY, None)
    if cluster.layout.state.exists():
        cluster.save()
    if failures or left:
        raise RealNodeError("; ".join([*failures, *(f"left: {x}" for x in left)]))


def _kill_tasks(node: RealNode) -> None:
    listing = subprocess.run(_ctr(node, "tasks", "ls", "-q"), capture_output=True, text=True, check=False)
    for task in listing.stdout.split():
        subprocess.run(
            _ctr(node, "tasks", "kill", "--all", "--signal", "SIGKILL", task),
            capture_output=True,
            check=False,
        )
        subprocess.run(_ctr(node, "tasks", "delete", "--force", task), capture_output=True, check=False)


def _kill_shims(node: RealNode) -> None:
    shims = _shims(node.paths.containerd_socket)
    for pid in shims:
        _kill_tree(pid)
    wait_for(lambda: not any(pid_alive(p) for p in shims), 10, "shims gone", interval=0.1)


def _unmount(root: Path) -> None:
    for point in _mounts_under(root):
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
            _run(["umount", "--lazy", point], f"unmount {point}")


def _container_ids(node: RealNode) -> list[str]:
    listing = subprocess.run(
        _ctr(node, "containers", "ls", "-q"), capture_output=True, text=True, check=False
    )
    return listing.stdout.split()


def _host_files(node: RealNode, container_ids: Iterable[str]) -> list[Path]:
    """Files of this node outside its root: libcni's cached results of its sandboxes (its bridge network
    and containerd's own loopback one, named <network>-<sandbox id>-<ifname>), the kubelet's plugin socket."""
    out: set[Path] = set()
    if CNI_RESULTS_DIR.is_dir():
        out.update(CNI_RESULTS_DIR.glob(f"{node.network}-*"))
        for cid in container_ids:
            out.update(CNI_RESULTS_DIR.glob(f"*-{cid}-*"))
    sock = DEVICE_PLUGIN_DIR / "kubelet.sock"
    if sock.is_socket():
        out.add(sock)
    return sorted(out)


def _remove_host_files(node: RealNode, container_ids: Iterable[str]) -> None:
    for path in _host_files(node, container_ids):
        path.unlink(missing_ok=True)


def _delete_bridge(node: RealNode) -> None:
    if Path(f"/sys/class/net/{node.bridge}").exists():
        _run(["ip", "link", "delete", node.bridge], "delete the CNI bridge")


def _remove_kubepods() -> None:
    for cg in _kubepods_cgroups():
        deadline = time.monotonic() + 5
        while True:
            try:
                cg.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY while the kernel still tears down a killed task's cgroup
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def _delete_node(cluster: Cluster, name: str) -> None:
    kube = Kube.connect(str(cluster.kubeconfig))
    try:
        kube.send(Request("DELETE", f"/api/v1/nodes/{name}"))
    except KubeError as exc:
        if exc.code not in (0, 404):  # 0: the apiserver is gone already, and the Node with it
            raise
    finally:
        kube.close()


def leftovers(node: RealNode, container_ids: Iterable[str] = ()) -> list[str]:
    """What of `node` still exists on this machine (empty after a clean `stop`); `container_ids`: its
    containers as listed before the teardown, whose cached CNI results count too."""
    out = [f"mount {m}" for m in _mounts_under(node.root)]
    out += [f"shim pid {p}" for p in _shims(node.paths.containerd_socket)]
    if Path(f"/sys/class/net/{node.bridge}").exists():
        out.append(f"bridge {node.bridge}")
    out += [f"cgroup {c}" for c in _kubepods_cgroups()]
    out += [f"file {f}" for f in _host_files(node, container_ids)]
    if node.root.exists():
        out.append(f"directory {node.root}")
    return out


def recorded(cluster: Cluster) -> RealNode | None:
    raw = cluster.meta.get(META_KEY)
    return RealNode.from_json(raw) if isinstance(raw, dict) else None
