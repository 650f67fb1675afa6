"""`python -m tests.devcluster up|down|status` (`make dev|down|status`): a local cluster with simulated GPU
nodes, kept running in the background."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from app.core import catalog

from . import kubeletnode
from .addons import DEV_ADDONS, Components, Definitions, RealNodeSide
from .binaries import BinariesError, ensure_binaries, repo_root
from .cluster import Cluster, default_dir, locked
from .components import CONTROL_PLANE
from .karpenter import autoscaler_addons
from .nodes import MigLayout
from .nodeside import STANDIN_MPS_RELPATH, NodeSide
from .processes import ComponentError, ManagedProcess

DEFAULT_NODES = 4
DEFAULT_GPUS_PER_NODE = 8
DEFAULT_GPU_MODEL = "A100-40GB"
EXAMPLES_RELPATH = Path("deploy/examples")
PROG = "python -m tests.devcluster"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def parser() -> argparse.ArgumentParser:
    """The harness's command line: one action per subcommand."""
    dev = argparse.ArgumentParser(
        prog=PROG, description="A local Kubernetes cluster with simulated GPU nodes."
    )
    actions = dev.add_subparsers(dest="dev_action", metavar="ACTION", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(name, help=help_text)
        parser.add_argument(
            "--dir",
            type=Path,
            default=None,
            help="cluster state directory (default: ${XDG_CACHE_HOME:-~/.cache}/gpupack/dev)",
        )
        return parser

    up = add("up", "start the cluster (idempotent) and return once it is ready")
    up.add_argument("--nodes", type=_positive, default=DEFAULT_NODES, help="fake GPU nodes (%(default)s)")
    up.add_argument(
        "--gpus-per-node", type=_positive, default=DEFAULT_GPUS_PER_NODE, help="GPUs per node (%(default)s)"
    )
    up.add_argument("--gpu-model", default=DEFAULT_GPU_MODEL, help="GPU model name (default %(default)s)")
    up.add_argument(
        "--mig",
        default="",
        metavar="PROFILES",
        help="partition GPUs into MIG devices of these profiles, e.g. 3g.40gb,2g.20gb,1g.10gb,1g.10gb",
    )
    up.add_argument(
        "--mig-gpus",
        type=_positive,
        default=None,
        help="with --mig: how many GPUs per node (the first ones) are partitioned (default: all)",
    )
    up.add_argument(
        "--no-components",
        dest="components",
        action="store_false",
        help="start only the control plane and nodes, not gpupack's extender, webhook and agents",
    )
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also run a real kubelet + containerd node (root; Debian containerd, runc, CNI plugins, "
        "busybox-static) with simulated GPUs, tainted gpupack.test/real-node=true:NoSchedule",
    )
    up.add_argument(
        "--autoscaler",
        action="store_true",
        help="also run Karpenter's kwok provider with a pool of 8-GPU nodes of --gpu-model, the extender "
        "asking it for GPUs, and an agent on every node it adds (docs/autoscaling.md)",
    )
    up.set_defaults(func=cmd_up)
    add("down", "stop every process of the cluster and verify none remains").set_defaults(func=cmd_down)
    add("status", "show each component's pid and health (exit 1 unless all are healthy)").set_defaults(
        func=cmd_status
    )
    return dev


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


def _err(action: str, message: str) -> None:
    print(f"{PROG} {action}: {message}", file=sys.stderr)


def _dir_flag(directory: Path) -> str:
    return "" if directory == default_dir().resolve() else f" --dir {directory}"


def _checkout() -> Path:
    root = repo_root()
    if root is None:
        raise FileNotFoundError("the dev cluster's --real-node runs the node side from a source checkout")
    return root


def _examples_dir() -> Path | None:
    root = repo_root()
    return root / EXAMPLES_RELPATH if root is not None and (root / EXAMPLES_RELPATH).is_dir() else None


def metrics_urls(processes: Sequence[ManagedProcess]) -> list[tuple[str, str]]:
    """(component, its /metrics URL) for each gpupack component: served where its health check is (the
    extender's plain ops port, the webhook's HTTPS port, each agent's port), all picked free at `dev up`."""
    return [
        (p.name, p.health.url.rsplit("/", 1)[0] + "/metrics")
        for p in processes
        if p.name not in CONTROL_PLANE and p.health is not None
    ]


def gpupack_command() -> str:
    """How to run the gpupack CLI this dev cluster runs: the script beside this interpreter (the venv's)."""
    script = Path(sys.executable).parent / "gpupack"
    return str(script) if script.is_file() else "gpupack"


def _summary(cluster: Cluster) -> str:
    meta = cluster.meta
    kubeconfig = cluster.kubeconfig
    kubectl = f"kubectl --kubeconfig {kubeconfig}"
    lines = [
        f"nodes: {meta.get('nodes')} x {meta.get('gpus_per_node')} {meta.get('gpu_model')} GPUs"
        + (f", the first {meta.get('mig_gpus')} as MIG devices {meta['mig']}" if meta.get("mig") else ""),
        f"kubeconfig: {kubeconfig}",
        f"  {kubectl} get nodes",
    ]
    components = [p for p in cluster.processes if p.name not in CONTROL_PLANE]
    if components:
        lines.append("gpupack: " + " ".join(f"{p.name}({p.pid})" for p in components))
        examples = _examples_dir()
        if examples is not None:
            lines += [
                "try it (the webhook turns the annotation into resources + env, the extender packs GPUs):",
                f"  {kubectl} create -f {examples / 'fraction-pod.yaml'}   # 0.5 GPU; twice: one GPU",
                f"  {kubectl} create -f {examples / 'memory-pod.yaml'}     # 4Gi of GPU memory",
            ]
        lines += [
            f"  {kubectl} get pods -o wide",
            f"  {kubectl} get gpunodes",
            f"  {gpupack_command()} top --kubeconfig {kubeconfig}",
        ]
    else:
        lines.append("gpupack components not started (--no-components): GPU pods stay Pending")
    node = kubeletnode.recorded(cluster)
    if node is not None:
        lines += [
            f"real node: {node.name} (kubelet + containerd, IP {node.ip}; pods need a toleration for "
            f"{kubeletnode.TAINT_KEY} and an image imported into it: {kubeletnode.BUSYBOX_IMAGE})",
        ]
    lines += [
        f"extender port (scheduler calls it, mutual TLS): {cluster.extender_port}   "
        f"webhook port: {cluster.webhook_port}   logs: {cluster.layout.logs}",
    ]
    urls = metrics_urls(cluster.processes)
    if urls:
        lines.append(f"metrics (ports picked free; the webhook's with the dev CA {cluster.ca_file}):")
        width = max(len(name) for name, _ in urls)
        lines += [f"  {name:<{width}}  {url}" for name, url in urls]
    lines += [
        f"status: {PROG} status{_dir_flag(cluster.dir)}",
        f"stop: {PROG} down{_dir_flag(cluster.dir)}",
    ]
    return "\n".join(lines)


def cmd_up(args: argparse.Namespace) -> int:
    try:
        model = catalog.lookup(args.gpu_model).name
    except KeyError as exc:
        _err("up", str(exc.args[0]))
        return 2
    mig = MigLayout.parse(args.mig, args.mig_gpus or args.gpus_per_node)
    if rule := mig.error(model, args.gpus_per_node):
        _err("up", f"--mig={args.mig!r}: {rule}")
        return 2
    directory: Path = (args.dir or default_dir()).resolve()
    t0 = time.monotonic()

    def progress(message: str) -> None:
        print(f"[dev up {time.monotonic() - t0:5.1f}s] {message}", file=sys.stderr, flush=True)

    with locked(directory):
        existing = Cluster.load(directory)
        if existing is not None and existing.running():
            print(f"dev cluster already running in {directory} (nothing started)")
            print(_summary(existing))
            if args.components and existing.meta.get("components") is False:
                print(
                    "(started with --no-components; for gpupack's components: "
                    f"{PROG} down{_dir_flag(directory)}, then up)"
                )
            return 0
        if existing is not None:
            progress("found a stopped or partial cluster; stopping what is left and starting fresh")
            _stop(existing)
        progress("Kubernetes binaries ($GPUPACK_K8S_BIN or tests/k8s/build.sh; a first build takes minutes)")
        try:
            bins = ensure_binaries(progress=sys.stderr)
        except BinariesError as exc:
            _err("up", str(exc))
            return 2
        cluster = Cluster.prepare(directory, bins)
        cluster.meta = {
            "nodes": args.nodes,
            "gpus_per_node": args.gpus_per_node,
            "gpu_model": model,
            "mig": ",".join(mig.profiles),
            "mig_gpus": mig.gpus,
            "components": args.components,
            # A real node runs pods that talk to the API (the chart's): they need their ServiceAccount token.
            "service_accounts": args.real_node,
        }
        addons = DEV_ADDONS
        if args.autoscaler:
            addons = autoscaler_addons(model)
            cluster.meta["autoscaler"] = True
        try:
            cluster.start(progress)
            progress(f"creating {args.nodes} nodes x {args.gpus_per_node} {model}")
            nodes = cluster.create_gpu_nodes(args.nodes, args.gpus_per_node, model, mig=mig)
            if args.real_node:
                node = kubeletnode.RealNode.of(cluster)
                progress(f"real node {node.name}: containerd + kubelet")
                claim = kubeletnode.claim_machine(cluster.dir, wait=False)
                try:
                    kubeletnode.start(cluster, node, progress)
                finally:
                    os.close(claim)  # the node's containerd now says who owns the machine's real node
                kubeletnode.as_gpu_node(cluster, node, model, args.gpus_per_node)
                nodes.append(node.name)
                # The chart's node side on the real node (nodeside.py); every path inside the cluster dir.
                side = NodeSide(
                    node.name, cluster.dir, node.paths.handler_dir, _checkout() / STANDIN_MPS_RELPATH
                )
                agents = {node.name: side.agent_flags()}
                addons = (
                    Definitions(),
                    RealNodeSide(side),
                    Components(mps_pipe_host_dir=side.pipe_dir, node_side_agents=agents),
                )
            for addon in addons if args.components else ():
                progress(f"addon {addon.name}")
                t_addon = time.monotonic()
                addon.start(cluster, nodes, progress)
                progress(f"addon {addon.name} ready in {time.monotonic() - t_addon:.1f}s")
            cluster.save()
        except BaseException as exc:  # Ctrl-C included: never leave half a cluster running
            _err("up", f"{type(exc).__name__}: {exc}")
            _err("up", f"stopping what was started; logs in {cluster.layout.logs}")
            _stop(cluster)
            if not isinstance(exc, Exception):
                raise
            return 1
    print(f"dev cluster ready in {directory} ({time.monotonic() - t0:.1f}s)")
    print(_summary(cluster))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    directory: Path = (args.dir or default_dir()).resolve()
    with locked(directory):
        cluster = Cluster.load(directory)
        if cluster is None:
            print(f"no dev cluster in {directory}; nothing to stop")
            return 0
        stopped = [f"{p.name}({p.pid})" for p in cluster.processes]
        try:
            _stop(cluster)
        except (ComponentError, kubeletnode.RealNodeError) as exc:
            _err("down", str(exc))
            return 1
        cluster.layout.state.unlink()
    print(f"stopped {len(stopped)} processes: {' '.join(reversed(stopped))}; none remains")
    return 0


def _stop(cluster: Cluster) -> None:
    """The real node first (its Node object goes while the apiserver runs), then every process; both run
    even when the first fails, and the first failure is raised."""
    node = kubeletnode.recorded(cluster)
    try:
        if node is not None:
            kubeletnode.stop(cluster, node)
    finally:
        cluster.stop()


def cmd_status(args: argparse.Namespace) -> int:
    directory: Path = (args.dir or default_dir()).resolve()
    cluster = Cluster.load(directory)
    if cluster is None:
        print(f"no dev cluster in {directory}")
        return 1
    rows = cluster.status()
    width = max([16, *(len(r.name) for r in rows)])  # agents are named after their (long) nodes
    print(f"{'COMPONENT':<{width}} {'PID':>8}  {'ALIVE':<5}  {'HEALTH':<9}  DETAIL")
    for row in rows:
        health = "healthy" if row.healthy else "unhealthy"
        alive = "yes" if row.alive else "no"
        print(f"{row.name:<{width}} {row.pid:>8}  {alive:<5}  {health:<9}  {row.detail}")
    ok = bool(rows) and all(r.healthy for r in rows)
    for name, url in metrics_urls(cluster.processes):
        print(f"metrics of {name}: {url}")
    print(f"kubeconfig: {cluster.kubeconfig}" if ok else "cluster is not healthy")
    return 0 if ok else 1
