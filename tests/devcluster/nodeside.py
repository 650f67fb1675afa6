"""The chart's node side on a dev cluster's real node, as host processes: what `dev up --real-node` runs.

On a GPU node the chart runs, per node (docs/node-side.md): the `mps-daemon` DaemonSet (`agent prepare-mps`,
then the MPS control daemon, multi-user), the `node-side` DaemonSet (`agent handler`: gpupack-runc and its
config into the directory containerd's config names for the `gpupack` runtime handler) and the agent with
`--node-socket` (it answers the handler: each MPS pod's own MPS directory and its share's env). The dev
cluster's real node gets the same, from the checkout instead of the image: the handler built by
handler/build.sh (Go), the MPS daemon the STAND-IN tests/standin/mps_control.py (no GPU here), and the agent
on the node's simulated GPUs. Its containerd already declares the handler (realnode.containerd_config, node
preparation); `dev down` removes the handler with the node's directory.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .identities import GPUPACK_NAMESPACE
from .processes import ComponentSpec

HANDLER_BUILD_RELPATH = Path("handler/build.sh")
STANDIN_MPS_RELPATH = Path("tests/standin/mps_control.py")
# The chart's <fullname>-node-side DaemonSet, which the installer asks for on SIGTERM: absent here.
INSTALLER_DAEMONSET = "gpupack-node-side"
MPS_DAEMON_PREFIX = "gpupack-mps-daemon-"
INSTALLER_PREFIX = "gpupack-node-side-"


class NodeSideError(RuntimeError):
    """The node side could not be prepared; the message says which step."""


@dataclass(frozen=True)
class NodeSide:
    """Where the node side of one real node keeps its state, all inside the cluster directory (as the
    chart's host paths are inside it in the real-node tier, tests/realnode/chart.py)."""

    node: str
    cluster_dir: Path
    handler_dir: Path  # containerd's BinaryName directory for the handler (the node's own)
    standin: Path  # the stand-in MPS control binary

    @property
    def pipe_dir(self) -> Path:
        """The MPS daemon's pipe directory (chart agent.mps.pipeDir); each MPS pod's directory is below it."""
        return self.cluster_dir / "mps-pipe"

    @property
    def log_dir(self) -> Path:
        return self.cluster_dir / "mps-log"

    @property
    def state_dir(self) -> Path:
        """nodeSide.stateDir: the agent's socket and the containers' records."""
        return self.cluster_dir / "node-side"

    @property
    def socket(self) -> Path:
        return self.state_dir / "agent.sock"

    @property
    def sim_state(self) -> Path:
        """The simulated GPUs' state (compute modes), shared by prepare-mps and the agent."""
        return self.cluster_dir / "sim-state" / self.node

    @property
    def control(self) -> Path:
        return self.pipe_dir / "control"

    def agent_flags(self) -> tuple[str, ...]:
        """What the chart's agent adds on a GPU node with MPS and the node side on (instead of --no-mps)."""
        return (
            "--mps-binary", str(self.standin),
            "--mps-pipe-dir", str(self.pipe_dir),
            "--node-socket", str(self.socket),
            "--sim-state", str(self.sim_state),
        )  # fmt: skip

    def prepare_argv(self, sim: Path) -> tuple[str, ...]:
        """The mps-daemon pod's init: the GPUs' compute modes kept, the ready record for this boot written."""
        return (
            sys.executable, "-m", "app.cli", "agent", "prepare-mps",
            "--pipe-dir", str(self.pipe_dir), "--compute-mode", "keep",
            "--node", self.node, "--sim", str(sim), "--sim-state", str(self.sim_state),
        )  # fmt: skip

    def mps_daemon_spec(self) -> ComponentSpec:
        """The stand-in control daemon in the foreground, one server for every uid (-M), as the chart's."""
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}
        argv = (sys.executable, str(self.standin), "-f", "-M")
        return ComponentSpec(f"{MPS_DAEMON_PREFIX}{self.node}", argv, env=env, ready_timeout_s=30)

    def installer_spec(self, handler: Path, kubeconfig: Path) -> ComponentSpec:
        """`agent handler`, as the chart's node-side DaemonSet runs it (runtime runc)."""
        argv = (
            sys.executable, "-m", "app.cli", "agent", "handler",
            "--source", str(handler), "--install-dir", str(self.handler_dir), "--runtime", "runc",
            "--socket", str(self.socket), "--state-dir", str(self.state_dir),
            "--daemonset", INSTALLER_DAEMONSET, "--namespace", GPUPACK_NAMESPACE,
            "--kubeconfig", str(kubeconfig),
        )  # fmt: skip
        return ComponentSpec(f"{INSTALLER_PREFIX}{self.node}", argv, ready_timeout_s=30)


def build_handler(repo: Path) -> Path:
    """gpupack-runc from handler/ (handler/build.sh: Go, cached by version and source hash)."""
    done = subprocess.run(
        ["bash", str(repo / HANDLER_BUILD_RELPATH)], capture_output=True, text=True, check=False, timeout=600
    )
    if done.returncode != 0:
        raise NodeSideError(f"handler/build.sh exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def prepare(side: NodeSide, sim: Path) -> None:
    """The node's host directories, then the mps-daemon pod's init, once."""
    for d in (side.sim_state, side.pipe_dir, side.log_dir, side.state_dir, side.handler_dir):
        d.mkdir(parents=True, exist_ok=True)  # the chart's hostPath volumes are DirectoryOrCreate
    done = subprocess.run(
        list(side.prepare_argv(sim)), capture_output=True, text=True, check=False, timeout=120
    )
    if done.returncode != 0:
        raise NodeSideError(f"agent prepare-mps exited {done.returncode}: {done.stderr.strip()[-500:]}")
