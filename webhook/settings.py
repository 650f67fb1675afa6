"""The webhook's settings: one typed value, set once at start-up from the command line or the chart, with
a validate() that reports every bad field at once."""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.core import names
from app.core.errors import SettingError
from app.service.settings import Checker, setting

# Settings fields whose flag is not just the field name in kebab case.
FLAGS = {"cert_file": "--cert", "key_file": "--key", "cert_check_interval_s": "--cert-check-interval"}

MAX_GPU_MEMORY_MIB = 1 << 24  # 16 TiB: far above any GPU, low enough to catch a value given in bytes
MAX_WORKERS = 64  # processes, each ~40 MiB of its own: more than the CPUs only adds switching

# spec.schedulerName must be a DNS-1123 subdomain, or the apiserver rejects every pod we mutate.
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True, slots=True)
class Settings:
    # Set spec.schedulerName on GPU pods only when configured.
    scheduler_name: str | None = setting(None, "set spec.schedulerName on GPU pods")
    mps_pipe_host_dir: str = setting(names.MPS_PIPE_DIRECTORY, "host dir of the node's MPS daemon pipe")
    # gpupack's RuntimeClass: MPS shares get spec.runtimeClassName and the node adds each pod's own MPS
    # directory (docs/node-side.md). None: legacy, a hostPath volume of the pipe dir in the pod.
    runtime_class: str | None = setting(
        None,
        "gpupack's RuntimeClass for MPS shares (the node adds each pod's MPS directory; docs/node-side.md); "
        "empty: a hostPath volume of the pipe dir in the pod",
    )
    # Rewrite pods asking for HAMi's nvidia.com/gpumem, gpumem-percentage or gpucores into a gpupack share
    # (webhook.hami); off by default: such pods are then left alone, for HAMi or the device plugin.
    hami_takeover: bool = setting(
        False,
        "rewrite pods that ask for HAMi's nvidia.com/gpumem, gpumem-percentage or gpucores into a gpupack "
        "GPU share (the webhook configuration's matchConditions must send them too)",
    )
    # Quota: a fraction is charged memory from the GPUs the cluster has (app.core.quota.Fleet), read from the
    # GPUNode objects by an informer in each worker; the fallback when none of an allowed model is known.
    read_gpunodes: bool = setting(
        False,
        "read the GPUNode objects (get, list, watch) and charge a fraction's quota memory from the largest "
        "GPU of the cluster it may land on; not ready until the first list",
    )
    kubeconfig: str | None = setting(
        None, "kubeconfig file for --read-gpunodes", shown="in-cluster, then ~/.kube/config"
    )
    quota_gpu_memory_mib: int | None = setting(
        None,
        "GPU memory (MiB) a fraction is charged a share of when no GPU it may land on is known; "
        "unset: the largest model of the GPU catalogue",
    )
    # Serving: HTTPS with a certificate that is reloaded when its files change.
    cert_file: str | None = setting(None, "PEM serving certificate (reloaded when it changes)")
    key_file: str | None = setting(None, "PEM private key of the certificate")  # None: no TLS (tests)
    host: str = setting("0.0.0.0", "address to listen on")
    port: int = setting(8443, "HTTPS port of /mutate, /healthz, /readyz, /metrics")
    cert_check_interval_s: float = setting(1.0, "seconds between cert file checks")
    # Worker processes on the one port (webhook.workers): reviews are stateless, so N answer like one,
    # N times as fast on N CPUs; /metrics then sums every worker's series.
    workers: int = setting(1, "worker processes answering on the port, about one per CPU the pod may use")
    log_level: str = setting("info", "log level: debug, info, warning, error")

    def validate(self) -> list[SettingError]:
        check = Checker(FLAGS)
        name = self.scheduler_name
        if name is not None and not (len(name) <= 253 and _DNS1123_SUBDOMAIN.match(name)):
            rule = (
                "must be a DNS-1123 subdomain (lowercase letters, digits, '-', '.'; at most 253 characters)"
            )
            check.bad("scheduler_name", name, rule)
        parts = self.mps_pipe_host_dir.split("/")
        if not self.mps_pipe_host_dir.startswith("/") or ".." in parts:
            check.bad("mps_pipe_host_dir", self.mps_pipe_host_dir, "must be an absolute path without '..'")
        if self.runtime_class is not None and not (
            len(self.runtime_class) <= 253 and _DNS1123_SUBDOMAIN.match(self.runtime_class)
        ):
            check.bad(
                "runtime_class", self.runtime_class, "must be a DNS-1123 subdomain (a RuntimeClass name)"
            )
        if self.cert_file is not None or self.key_file is not None:
            for field in ("cert_file", "key_file"):
                check.readable_file(field, getattr(self, field), "must name a readable PEM file")
        if self.quota_gpu_memory_mib is not None and not 1 <= self.quota_gpu_memory_mib <= MAX_GPU_MEMORY_MIB:
            check.bad(
                "quota_gpu_memory_mib",
                self.quota_gpu_memory_mib,
                f"must be a whole number of MiB from 1 to {MAX_GPU_MEMORY_MIB}",
            )
        check.port("port", self.port)
        check.positive("cert_check_interval_s", self.cert_check_interval_s)
        if not 1 <= self.workers <= MAX_WORKERS:
            check.bad("workers", self.workers, f"must be a whole number from 1 to {MAX_WORKERS}")
        return check.errors
