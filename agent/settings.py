"""The node agent's settings: one typed value with a validate() that reports every bad field at once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app import names
from app.errors import SettingError
from app.settings import Checker

# Settings fields whose flag is not just the field name in kebab case.
FLAGS = {
    "heartbeat_s": "--heartbeat",
    "interval_s": "--interval",
    "min_write_interval_s": "--min-write-interval",
    "mps": "--no-mps",
}


@dataclass(frozen=True, slots=True)
class Settings:
    node: str  # this node's name (the agent writes only its Node and GPUNode)
    kubeconfig: str | None = None  # None: in-cluster, then ~/.kube/config
    sim: Path | None = None  # a simulated GPU set file instead of NVML
    sim_state: Path | None = (
        None  # the simulated driver's state (compute modes), shared with the MPS daemon pod
    )
    heartbeat_s: float = 30.0  # status heartbeat
    interval_s: float = 5.0  # NVML sampling interval
    min_write_interval_s: float = 5.0  # least time between status writes
    memory_threshold_mib: int = 256  # memory change that triggers a write
    host: str = "0.0.0.0"  # address of /metrics and /healthz
    port: int = 9400  # port of /metrics and /healthz; 0: none
    proc_root: Path = Path("/proc")  # the host's /proc, for pid → pod
    toolkit_config: Path = Path("/etc/nvidia-container-runtime/config.toml")
    evict_on_violation: bool = False  # evict pods off their GPU or over memory
    mps: bool = True  # run the MPS control daemon
    mps_binary: str = "nvidia-cuda-mps-control"
    mps_pipe_dir: Path = Path(names.MPS_PIPE_DIRECTORY)
    mps_exclusive_process: bool = False  # keep MPS GPUs in EXCLUSIVE_PROCESS (switching only idle ones)
    mps_thread_percentage: int = 100  # the daemon's default active thread percentage
    mps_pinned_mem_limit_mib: int | None = None  # the daemon's default per device
    # The RuntimeClass handler's question socket (agent.nodeserver); None: this agent answers none.
    node_socket: Path | None = None
    log_level: str = "info"

    @property
    def max_step_age_s(self) -> float:
        """/healthz fails once the last cycle is older than this (three intervals, at least 30 s)."""
        return max(3 * self.interval_s, 30.0)

    def validate(self) -> list[SettingError]:
        check = Checker(FLAGS)
        if not self.node:
            check.bad("node", self.node, "required: pass --node or set NODE_NAME")
        if self.sim is not None:
            check.readable_file("sim", str(self.sim), "must name a simulated GPU set file")
        for field in ("heartbeat_s", "interval_s", "min_write_interval_s"):
            check.positive(field, getattr(self, field), "must be a positive duration like 30s, 500ms, 2m")
        if self.memory_threshold_mib < 0:
            check.bad("memory_threshold_mib", self.memory_threshold_mib, "must be >= 0")
        check.port("port", self.port, zero="no /metrics and /healthz")
        if not 1 <= self.mps_thread_percentage <= 100:
            check.bad("mps_thread_percentage", self.mps_thread_percentage, "must be in 1..100")
        if self.mps_pinned_mem_limit_mib is not None:
            check.positive("mps_pinned_mem_limit_mib", self.mps_pinned_mem_limit_mib, "must be >= 1")
        if self.node_socket is not None and not self.node_socket.is_absolute():
            check.bad("node_socket", str(self.node_socket), "must be an absolute path")
        return check.errors
