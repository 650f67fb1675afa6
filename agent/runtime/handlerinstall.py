"""Put gpupack's RuntimeClass handler on the node, and take it away again when the release is uninstalled.

`gpupack agent handler` is the one container of the chart's node-side DaemonSet (on the agent's nodes). It
copies the image's `gpupack-runc` into the host's install dir (containerd's `BinaryName` for the handler,
declared when the node was prepared; see docs/node-side.md) with `gpupack-runc.json` beside it, then waits.
On SIGTERM it tells a rollout from an uninstall by asking for its own DaemonSet: still there → a rollout,
the files stay for the next pod (which overwrites them); gone, or no longer readable by this pod's
identity (helm deleted the RBAC and ServiceAccount with it) → an uninstall, and the binary and its config
are removed. Containers still running under the handler need it for `kill` and `delete`: while any has a
record in the state dir, the files are left in place and the log names those containers (drain MPS pods
before uninstalling). Both files are replaced by rename, so a shim that runs the handler meanwhile gets
the old or the new one, never half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core import log
from app.core.errors import KubeError
from app.kube.calls import Request

_log = log.get("gpupack.agent.handler")

BINARY = "gpupack-runc"
CONFIG = "gpupack-runc.json"
UNINSTALLED_CODES = (401, 403, 404)  # the DaemonSet, or this pod's right to read it, is gone


@dataclass(frozen=True, slots=True)
class HandlerFiles:
    install_dir: Path  # host dir, mounted at the same path
    runtime: str  # the real runtime the handler runs ("runc", or NVIDIA's runtime)
    socket: Path  # the agent's socket (host path)
    state_dir: Path  # the containers' records (host path)
    timeout_s: float = 10.0

    @property
    def binary(self) -> Path:
        return self.install_dir / BINARY

    @property
    def config(self) -> Path:
        return self.install_dir / CONFIG

    def config_json(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "socket": str(self.socket),
            "state_dir": str(self.state_dir),
            "timeout_s": self.timeout_s,
        }


def _replace(path: Path, write: Callable[[Path], object], mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    tmp.chmod(mode)
    tmp.replace(path)


def install(files: HandlerFiles, source: Path) -> None:
    """The binary and its config into the install dir (each by rename), the state dir created."""
    files.install_dir.mkdir(parents=True, exist_ok=True)
    files.state_dir.mkdir(parents=True, exist_ok=True)
    _replace(files.binary, lambda tmp: shutil.copyfile(source, tmp), 0o755)
    text = json.dumps(files.config_json(), indent=2) + "\n"
    _replace(files.config, lambda tmp: tmp.write_text(text), 0o644)
    _log.info("runtime handler installed", extra={"binary": str(files.binary), "runtime": files.runtime})


def in_use(files: HandlerFiles) -> list[str]:
    """Containers created through the handler and not deleted yet: '<namespace>/<pod> <container id>'."""
    out = []
    for record in sorted((files.state_dir / "containers").glob("*.json")):
        try:
            raw = json.loads(record.read_text())
            out.append(f"{raw.get('namespace')}/{raw.get('pod')} {raw.get('container_id')}")
        except (OSError, ValueError):
            out.append(record.stem)
    return out


def uninstall(files: HandlerFiles) -> bool:
    """Remove the binary and its config unless a container still runs under them; True when removed."""
    using = in_use(files)
    if using:
        _log.error(
            "runtime handler left in place: containers still run under it (drain MPS pods, then remove it)",
            extra={"binary": str(files.binary), "containers": using},
        )
        return False
    for path in (files.binary, files.config):
        path.unlink(missing_ok=True)
    for d in (files.install_dir, files.state_dir / "containers"):
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty: the operator may keep other files there
    _log.info("runtime handler removed", extra={"binary": str(files.binary)})
    return True


def release_gone(send: Callable[[Request], dict[str, Any]], namespace: str, daemonset: str) -> bool:
    """Whether this pod's DaemonSet is deleted (an uninstall), not merely rolling (an upgrade)."""
    path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{daemonset}"
    try:
        ds = send(Request("GET", path))
    except KubeError as exc:
        if exc.code in UNINSTALLED_CODES:
            return True
        _log.warning(
            "cannot tell an uninstall from a rollout; keeping the handler", extra={"error": exc.message}
        )
        return False
    return bool((ds.get("metadata") or {}).get("deletionTimestamp"))
