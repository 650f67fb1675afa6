"""The node agent's settings: one typed value with a validate() that reports every bad field at once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.core import names
from app.core.errors import SettingError
from app.service.settings import Checker, setting

# Settings fields whose flag is not just the field name in kebab case.
FLAGS = {
    "heartbeat_s": "--heartbeat",
    "interval_s": "--interval",
    "min_write_interval_s": "--min-write-interval",
    "mps": "--no-mps",
    "mps_drain_timeout_s": "--mps-drain-timeout",
    "mps_prestart_server": "--no-mps-prestart-server",
    "watchdog": "--no-watchdog",
}


@dataclass(frozen=True, slots=True)
class Settings:
    node: str = setting(
        help="node name (the agent writes only its Node and GPUNode)", shown="$NODE_NAME", required=True
    )
    kubeconfig: str | None = setting(None, "kubeconfig file", shown="in-cluster, then ~/.kube/config")
    sim: Path | None = setting(None, "simulated GPU set file instead of NVML")
    sim_state: Path | None = setting(
        None, "the simulated driver's state dir (compute modes), shared with the MPS daemon pod"
    )
    heartbeat_s: float = setting(30.0, "status heartbeat", unit="s")
    interval_s: float = setting(5.0, "NVML sampling interval", unit="s")
    min_write_interval_s: float = setting(5.0, "least time between status writes", unit="s")
    memory_threshold_mib: int = setting(256, "a GPU's used memory must move this many MiB to trigger a write")
    host: str = setting("0.0.0.0", "address of /metrics and /healthz")
    port: int = setting(9400, "port of /metrics and /healthz; 0: none")
    proc_root: Path = setting(Path("/proc"), "the host's /proc, for pid → pod")
    toolkit_config: Path = setting(
        Path("/etc/nvidia-container-runtime/config.toml"), "the NVIDIA container toolkit's config file"
    )
    evict_on_violation: bool = setting(False, "evict pods off their GPU or over memory")
    watchdog: bool = setting(
        True,
        "do not end processes on shared GPUs that are not where their allocation says (only report them)",
    )  # its flag is --no-watchdog
    watchdog_evict_after: int = setting(
        3, "evict a pod once the watchdog has ended this many of its processes; 0: never evict"
    )
    watchdog_exempt_namespaces: tuple[str, ...] = setting(
        (),
        "namespaces whose pods' processes the watchdog never ends, as a comma-separated list",
        shown="none",
    )
    watchdog_exempt_label: str | None = setting(
        None, "pods with this label (key=value) are never touched by the watchdog"
    )
    mps: bool = setting(True, "no MPS (do not look for the MPS daemon pod)")  # its flag is --no-mps
    mps_binary: str = setting("nvidia-cuda-mps-control", "the MPS control client's executable")
    mps_pipe_dir: Path = setting(Path(names.MPS_PIPE_DIRECTORY), "the MPS daemon's pipe directory")
    mps_exclusive_process: bool = setting(
        False, "keep MPS GPUs in EXCLUSIVE_PROCESS compute mode (an idle GPU is switched)"
    )
    mps_time_slice_gpus: tuple[int, ...] = setting(
        (),
        "GPU indexes left in DEFAULT compute mode with --mps-exclusive-process, as a comma-separated list: "
        "they take isolation: none shares beside MPS clients",
        shown="none",
    )
    mps_thread_percentage: int = setting(100, "the MPS daemon's default active thread percentage")
    mps_pinned_mem_limit_mib: int | None = setting(
        None, "the MPS daemon's default pinned memory limit per device, MiB"
    )
    mps_protocol: int = setting(
        2, "the MPS daemon's protocol: 3 = MPS v3 (r615+), a namespace per GPU container; 2 = legacy"
    )
    mps_prestart_server: bool = setting(
        True,
        "do not start an MPS server before the first client (for a daemon without -M; with EXCLUSIVE_PROCESS "
        "a plain process then takes the GPU until a client comes)",
    )  # its flag is --no-mps-prestart-server
    mps_drain_timeout_s: float = setting(
        5.0,
        "at each stop of an MPS container, end its clients through the MPS daemon first, waiting at most "
        "this long (then the stop goes on); 0: no drain, and a busy neighbour on its GPU may fail",
        unit="s",
    )
    sim_allocator: Path | None = setting(
        None, "serve the simulated GPUs' allocator on this unix socket (with --sim; docs/node-side.md)"
    )
    node_socket: Path | None = setting(
        None, "answer gpupack's RuntimeClass handler on this unix socket (docs/node-side.md)"
    )
    log_level: str = setting("info", "log level: debug, info, warning, error")

    @property
    def max_step_age_s(self) -> float:
        """/healthz fails once the last cycle is older than this (three intervals, at least 30 s)."""
        return max(3 * self.interval_s, 30.0)

    @property
    def watchdog_exemption(self) -> tuple[str, str] | None:
        """`watchdog_exempt_label` as (key, value); None when unset."""
        if self.watchdog_exempt_label is None:
            return None
        key, _, value = self.watchdog_exempt_label.partition("=")
        return key.strip(), value.strip()

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
        if any(i < 0 for i in self.mps_time_slice_gpus):
            check.bad(
                "mps_time_slice_gpus", ",".join(map(str, self.mps_time_slice_gpus)), "indexes must be >= 0"
            )
        if self.mps_drain_timeout_s < 0 or self.mps_drain_timeout_s > 60:
            check.bad("mps_drain_timeout_s", self.mps_drain_timeout_s, "must be from 0 (no drain) to 60 s")
        if self.watchdog_evict_after < 0:
            check.bad("watchdog_evict_after", self.watchdog_evict_after, "must be >= 0 (0: never evict)")
        label = self.watchdog_exempt_label
        if label is not None and (not label.partition("=")[1] or not label.partition("=")[0].strip()):
            check.bad("watchdog_exempt_label", label, "must be one label as key=value, e.g. team=platform")
        if self.mps_protocol not in (2, 3):
            check.bad("mps_protocol", self.mps_protocol, "must be 2 (legacy MPS) or 3 (MPS v3)")
        if self.sim_allocator is not None and (self.sim is None or not self.sim_allocator.is_absolute()):
            check.bad("sim_allocator", str(self.sim_allocator), "must be an absolute path, and needs --sim")
        if self.node_socket is not None and not self.node_socket.is_absolute():
            check.bad("node_socket", str(self.node_socket), "must be an absolute path")
        return check.errors
