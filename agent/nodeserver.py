"""The agent's answer to the RuntimeClass handler: a unix socket, one JSON line in, one JSON line out.

Each connection carries one question (agent.nodeside.Ask). The pod is read from the apiserver at that
moment (a fresh list by name; the agent's periodic listing may predate a pod bound a second ago), the
answer computed by agent.nodeside, and the pod's MPS directory prepared by agent.pipedirs. Every failure
is an answer with a reason, never a dropped connection: the handler fails the container's OCI `create`
with it, which the pod's status shows. While the agent is down or restarting nothing listens, the
handler's connect fails, and it refuses the container with that.

A maintenance thread renews the pods' links to the MPS daemon and removes the directories of pods that
left the node.
"""

from __future__ import annotations

import json
import os
import socketserver
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent import nodeside, verify
from agent.pipedirs import PipeDirs
from app import log, podview
from app.errors import KubeError
from app.kube import paths
from app.kube.calls import Request

_log = log.get("gpupack.agent.nodeside")

MAX_LINE = 64 * 1024
READ_TIMEOUT_S = 5.0
MAINTENANCE_S = 30.0


def read_pod(namespace: str, name: str) -> Request:
    """One pod, read fresh (no resourceVersion: a quorum read), as a list by name: the agent's RBAC lists
    pods and needs no `get` for this."""
    return Request("GET", paths.pods(namespace), query={"fieldSelector": f"metadata.name={name}"})


class NodeServer:
    """`start()` listens on `socket_path` (mode 0600: only root, as the handler runs); `stop()` ends."""

    def __init__(
        self,
        socket_path: Path,
        node: str,
        pipe_dirs: PipeDirs,
        send: Callable[[Request], dict[str, Any]],
        *,
        maintenance_s: float = MAINTENANCE_S,
        mps_not_ready: Callable[[Sequence[str]], str] = nodeside.always_ready,
    ) -> None:
        self.socket_path = socket_path
        self.node = node
        self.pipe_dirs = pipe_dirs
        self.send = send
        self.maintenance_s = maintenance_s
        self.mps_not_ready = mps_not_ready
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def reply(self, line: bytes) -> nodeside.Answer:
        """The answer to one request line."""
        try:
            raw = json.loads(line)
        except ValueError as exc:
            return nodeside.refuse(f"malformed request: not JSON ({exc})")
        ask = nodeside.parse_ask(raw)
        if isinstance(ask, str):
            return nodeside.refuse(ask)
        try:
            listed = self.send(read_pod(ask.namespace, ask.name))
        except KubeError as exc:
            return nodeside.refuse(
                f"the agent cannot read {ask.where} from the apiserver ({exc.code}: {exc.message})"
            )
        items = listed.get("items") or []
        pod = podview.read(items[0]) if items else None
        grant = nodeside.decide(ask, pod, self.node, self.mps_not_ready)
        if isinstance(grant, nodeside.Answer):
            return grant
        mps_dir: str | None = None
        if grant.mps:
            prepared = self.pipe_dirs.ensure(ask.pod_uid)
            if isinstance(prepared, str):
                return nodeside.refuse(prepared)
            mps_dir = str(prepared)
        return nodeside.answer(grant, mps_dir)

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)  # a previous agent's: nothing listens there any more
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = READ_TIMEOUT_S

            def handle(self) -> None:
                try:
                    line = self.rfile.readline(MAX_LINE)
                except OSError:
                    return
                try:
                    answer = outer.reply(line)
                except Exception as exc:  # a bug here must still reach the pod as a reason
                    _log.exception("node-side answer failed")
                    answer = nodeside.refuse(f"the gpupack agent failed to answer ({type(exc).__name__})")
                _log.info(
                    "node-side answer",
                    extra={"request": line[:500].decode(errors="replace").strip(), "allowed": answer.allowed,
                           "reason": answer.reason},
                )  # fmt: skip
                self.wfile.write(json.dumps(answer.to_json()).encode() + b"\n")

        old = os.umask(0o177)
        try:
            self._server = socketserver.ThreadingUnixStreamServer(str(self.socket_path), Handler)
        finally:
            os.umask(old)
        self._server.daemon_threads = True
        self._threads = [
            threading.Thread(target=self._server.serve_forever, name="node-side", daemon=True),
            threading.Thread(target=self._maintain, name="node-side-maintenance", daemon=True),
        ]
        for t in self._threads:
            t.start()
        _log.info("node side listening", extra={"socket": str(self.socket_path)})

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self.socket_path.unlink(missing_ok=True)
        for t in self._threads:
            t.join(timeout=5)

    def maintain_once(self) -> None:
        self.pipe_dirs.refresh()
        try:
            listed = self.send(verify.list_pods(self.node))
        except KubeError as exc:
            _log.warning("node-side maintenance: listing pods failed", extra={"error": exc.message})
            return
        keep = {str((p.get("metadata") or {}).get("uid") or "") for p in listed.get("items", [])}
        removed = self.pipe_dirs.prune(keep, older_than_s=2 * self.maintenance_s)
        if removed:
            _log.info("removed MPS directories of pods gone from the node", extra={"pods": removed})

    def _maintain(self) -> None:
        while not self._stop.wait(self.maintenance_s):
            try:
                self.maintain_once()
            except Exception:
                _log.exception("node-side maintenance failed")
