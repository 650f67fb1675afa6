"""Where everything of one dev cluster lives inside its directory, and which ports it uses."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .pki import Pki


@dataclass(frozen=True)
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    kwok: int
    extender: int  # reserved for the extender; the scheduler config points here before it runs
    webhook: int  # reserved for the webhook's HTTPS server
    extender_ops: int = 0  # the extender's plain-HTTP /healthz, /readyz, /metrics (0: older state.json)
    controller_manager: int = 0  # kube-controller-manager's HTTPS /healthz (0: older state.json)

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Ports:
        return cls(**{k: int(v) for k, v in raw.items()})


@dataclass(frozen=True)
class Layout:
    dir: Path

    @property
    def state(self) -> Path:
        return self.dir / "state.json"

    @property
    def lock(self) -> Path:
        return self.dir / ".lock"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig; the path users and tests point kubectl at."""
        return self.dir / "kubeconfig"

    @property
    def kubeconfigs(self) -> Path:
        return self.dir / "kubeconfigs"

    def kubeconfig_for(self, identity: str) -> Path:
        return self.kubeconfig if identity == "admin" else self.kubeconfigs / f"{identity}.kubeconfig"

    @property
    def pki(self) -> Pki:
        return Pki(self.dir / "pki")

    @property
    def tokens_csv(self) -> Path:
        return self.dir / "tokens.csv"

    @property
    def tokens_json(self) -> Path:
        return self.dir / "tokens.json"

    @property
    def etcd_data(self) -> Path:
        return self.dir / "etcd"

    @property
    def apiserver_cert_dir(self) -> Path:
        return self.dir / "apiserver-certs"

    @property
    def scheduler_config(self) -> Path:
        return self.dir / "kube-scheduler-config.yaml"

    @property
    def kwok_config(self) -> Path:
        return self.dir / "kwok.yaml"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def generated(self) -> tuple[Path, ...]:
        """Everything `prepare` writes; a fresh `up` removes exactly these (never the directory itself)."""
        return (
            self.state,
            self.kubeconfig,
            self.kubeconfigs,
            self.pki.dir,
            self.tokens_csv,
            self.tokens_json,
            self.etcd_data,
            self.apiserver_cert_dir,
            self.scheduler_config,
            self.kwok_config,
            self.logs,
        )
