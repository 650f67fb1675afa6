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

The guard (`--guard`): the same binary installed a second time as `gpupack-runc-guard`, the node's *default*
runtime, which gives every container without a gpupack allocation `NVIDIA_VISIBLE_DEVICES=void` unless its
pod is exempt (handler/guard.go). Node preparation points containerd's default runtime at
`<install dir>/gpupack-runc-guard` and makes that path a symlink to the node's previous default runtime
(runc, or NVIDIA's runtime), so the node runs as before until the installer comes. The installer keeps that
link as `gpupack-runc-guard.previous`, writes the guard's config (the link's target is its real runtime),
then puts the guard binary in its place. Uninstall, or `--no-guard`, renames the link back: the node's
default runtime is its previous one again, with no containerd restart. Each step is a rename, so containerd
always finds a runtime at that path.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.runtime.nodeside import NVIDIA_MEMORY_LIMIT_ENV
from app.core import log, names
from app.core.errors import KubeError
from app.kube.calls import Request

_log = log.get("gpupack.agent.handler")

BINARY = "gpupack-runc"
CONFIG = "gpupack-runc.json"
UNINSTALLED_CODES = (401, 403, 404)  # the DaemonSet, or this pod's right to read it, is gone
GUARD_BINARY = "gpupack-runc-guard"  # containerd's BinaryName of the node's default runtime
GUARD_CONFIG = "gpupack-runc-guard.json"
GUARD_PREVIOUS = "gpupack-runc-guard.previous"  # the node's previous default runtime, kept as a symlink
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # a DNS-1123 label


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


def _replace(path: Path, write: Callable[[Path], object], mode: int, follow: bool = True) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    write(tmp)
    if follow:  # a symlink has no mode of its own
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


@dataclass(frozen=True, slots=True)
class GuardFiles:
    """The guard's files in the install dir, and what its config says."""

    install_dir: Path
    state_dir: Path
    exempt_namespaces: tuple[str, ...] = ()
    exempt_pods: tuple[str, ...] = ()  # "<namespace>/<pod name prefix>"

    @property
    def binary(self) -> Path:
        return self.install_dir / GUARD_BINARY

    @property
    def config(self) -> Path:
        return self.install_dir / GUARD_CONFIG

    @property
    def previous(self) -> Path:
        return self.install_dir / GUARD_PREVIOUS

    def config_json(self, runtime: str) -> dict[str, Any]:
        return {
            "runtime": runtime,
            "state_dir": str(self.state_dir),
            "exempt_namespaces": list(self.exempt_namespaces),
            "exempt_pods": list(self.exempt_pods),
            "allocation_annotation": names.ALLOC_GPU_UUIDS,
            "env": {names.ENV_NVIDIA_VISIBLE_DEVICES: names.NO_GPU},
            "unset": list(NVIDIA_MEMORY_LIMIT_ENV),
        }


def exemption_problems(namespaces: tuple[str, ...], pods: tuple[str, ...]) -> list[str]:
    """What is wrong with the exemptions, each naming the flag, the value and the rule."""
    out = [
        f"--exempt-namespace={ns!r}: must be a namespace name (a DNS-1123 label: lowercase letters, digits "
        "and '-', at most 63 characters)"
        for ns in namespaces
        if not (len(ns) <= 63 and _NAMESPACE.fullmatch(ns))
    ]
    for entry in pods:
        ns, slash, prefix = entry.partition("/")
        if not slash or not prefix or not (len(ns) <= 63 and _NAMESPACE.fullmatch(ns)):
            out.append(
                f"--exempt-pod={entry!r}: must be <namespace>/<pod name prefix>, "
                "e.g. monitoring/dcgm-exporter-"
            )
    return out


def _link_target(link: Path) -> str:
    target = os.readlink(link)
    return target if os.path.isabs(target) else os.path.normpath(link.parent / target)


def previous_runtime(files: GuardFiles) -> str:
    """The node's previous default runtime (an absolute path); ValueError says why it cannot be known."""
    if files.previous.is_symlink():  # installed before: the kept link
        return _link_target(files.previous)
    if files.binary.is_symlink():  # node preparation's link, the guard not installed yet
        target = _link_target(files.binary)
        if Path(target).name in (BINARY, GUARD_BINARY):
            raise ValueError(f"{files.binary} links to {target}, gpupack's own handler, not a real runtime")
        return target
    if not files.binary.exists():
        raise ValueError(
            f"{files.binary} does not exist: this node is not prepared for the guard (containerd's "
            "default runtime must name it, and it must link to the node's previous default runtime; "
            "docs/node-side.md)"
        )
    raise ValueError(
        f"{files.binary} is a file, not a link to the node's default runtime, and {files.previous} is "
        "missing: the previous default runtime cannot be known; make it a symlink to runc (or NVIDIA's "
        "runtime)"
    )


def install_guard(files: GuardFiles, source: Path) -> str:
    """The guard in containerd's default runtime's place; "" when installed, else why not (then nothing
    changed)."""
    try:
        runtime = previous_runtime(files)
    except ValueError as exc:
        _log.error(
            "guard not installed: containers without a gpupack allocation keep every GPU their env asks "
            "for on this node",
            extra={"reason": str(exc)},
        )
        return str(exc)
    files.state_dir.mkdir(parents=True, exist_ok=True)
    if not files.previous.is_symlink():
        _replace(files.previous, lambda tmp: tmp.symlink_to(runtime), 0o777, follow=False)
    text = json.dumps(files.config_json(runtime), indent=2) + "\n"
    _replace(files.config, lambda tmp: tmp.write_text(text), 0o644)
    _replace(files.binary, lambda tmp: shutil.copyfile(source, tmp), 0o755)
    exempt = {"exempt_namespaces": list(files.exempt_namespaces), "exempt_pods": list(files.exempt_pods)}
    _log.info(
        "guard installed as the node's default runtime",
        extra={"binary": str(files.binary), "runtime": runtime, **exempt},
    )
    return ""


def uninstall_guard(files: GuardFiles) -> bool:
    """The node's previous default runtime back at containerd's path; True when it was restored.

    Containers the guard created need nothing of it to stop: it edits only `create`."""
    if not files.previous.is_symlink():
        return False
    runtime = _link_target(files.previous)
    files.previous.replace(files.binary)
    files.config.unlink(missing_ok=True)
    guarded = files.state_dir / "guarded"
    if guarded.is_dir():
        shutil.rmtree(guarded, ignore_errors=True)  # the guard no longer removes them on delete
    _log.info("guard removed: the node's previous default runtime is back", extra={"runtime": runtime})
    return True
