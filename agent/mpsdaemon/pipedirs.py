"""Each MPS pod's own directory under the node's MPS pipe directory: <pipe>/pods/<pod uid>/.

A client reaches the MPS control daemon through the socket `control` in its CUDA_MPS_PIPE_DIRECTORY.
Mounting the whole pipe directory would hand every tenant the directory of every other pod (and,
with MPS v3, every other namespace's sockets); instead each pod gets a directory of its own holding
only a hard link to the daemon's `control` socket (a socket is reached by its inode, so the link
connects to the daemon like the original). The daemon recreates its socket when it restarts, so the
links are renewed whenever the inode changes (`refresh`, every maintenance pass), and the directory of
a pod no longer on the node is removed (`prune`).

Whether legacy MPS clients need more of the pipe directory than `control` (server sockets, the daemon's
shared memory) is UNVERIFIED until a GPU shows it (tests/gpu); docs/node-side.md says so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Iterable
from pathlib import Path

from app.core import log

_log = log.get("gpupack.agent.pipedirs")

CONTROL = "control"
PODS = "pods"


class PipeDirs:
    """The per-pod directories under `pipe_dir` (a host path; the agent mounts it at the same path)."""

    def __init__(self, pipe_dir: Path, connect_timeout_s: float = 1.0) -> None:
        self.pipe_dir = pipe_dir
        self.root = pipe_dir / PODS
        self.connect_timeout_s = connect_timeout_s

    @property
    def control(self) -> Path:
        return self.pipe_dir / CONTROL

    def backend_down(self) -> str:
        """Why no MPS client could reach the daemon now ("" when its control socket accepts a connection).

        The daemon's `control` is a SOCK_SEQPACKET socket (measured: a stream connect fails with EPROTOTYPE,
        which would read as a daemon that never answers)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.settimeout(self.connect_timeout_s)
            try:
                s.connect(str(self.control))
            except OSError as exc:
                return (
                    f"the MPS control daemon does not answer at {self.control} "
                    f"({exc.strerror or exc}); the container starts once it does"
                )
        return ""

    def ensure(self, pod_uid: str) -> Path | str:
        """The pod's directory with a live link to the daemon, or why the MPS backend cannot serve it."""
        down = self.backend_down()
        if down:
            return down
        if not pod_uid or "/" in pod_uid or pod_uid in (".", ".."):
            return f"pod uid {pod_uid!r} cannot name a directory"
        d = self.root / pod_uid
        try:
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)
            self._link(d)
        except OSError as exc:
            return f"cannot prepare the pod's MPS directory {d}: {exc}"
        return d

    def refresh(self) -> None:
        """Renew every pod's link where the daemon's socket changed (it restarted)."""
        for d in self._dirs():
            try:
                self._link(d)
            except OSError as exc:
                _log.warning("MPS link not renewed", extra={"dir": str(d), "error": str(exc)})

    def prune(self, keep: Iterable[str], older_than_s: float, now: float | None = None) -> list[str]:
        """Remove the directories of pods not in `keep`; a directory younger than `older_than_s` stays
        (its pod may be newer than the listing that `keep` came from). Returns the removed uids."""
        keep = set(keep)
        now = time.time() if now is None else now
        removed = []
        for d in self._dirs():
            if d.name in keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                if now - d.stat().st_mtime < older_than_s:
                    continue
                shutil.rmtree(d)
                removed.append(d.name)
        return removed

    def _dirs(self) -> list[Path]:
        try:
            return [d for d in self.root.iterdir() if d.is_dir() and not d.is_symlink()]
        except FileNotFoundError:
            return []

    def _link(self, d: Path) -> None:
        target = d / CONTROL
        try:
            source = os.stat(self.control)
        except FileNotFoundError:
            return  # no daemon now: ensure() refuses new containers; links are renewed when it is back
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(target).st_ino == source.st_ino:
                return
        tmp = d / f".{CONTROL}.tmp"
        tmp.unlink(missing_ok=True)
        os.link(self.control, tmp)
        tmp.replace(target)  # atomic: a client never finds the name missing
