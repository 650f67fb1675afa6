"""MPS v3 (driver r615): one named namespace per container, with its own limits and pipe directory.

With the control daemon in v3 mode (`nvidia-cuda-mps-control -p 3 -m`), the agent keeps one named server
(`gpupack`, uid 0: multi-user allows no other) and gives each GPU container a namespace of its own:
created with the container's thread percentage and pinned memory limit (a named namespace inherits nothing
from its server, so both are always set), mounted into the container as its whole MPS directory
(`<pipe>/<server>/<namespace>`, whose `control` socket routes clients to that namespace), and deleted when
the container ends. Commands are r615's CLI as NVIDIA documents it (`namespace create <ns> --server=<s>`,
...); the node's control binary is run once per command with the daemon's pipe directory
(agent.mpsdaemon.mpscontrol: an answer is judged by its words, as the legacy binary exits 0 when it
refuses), and a namespace's limits are read back from `namespace list` before its container may start. The
v3 CLI's answers are UNVERIFIED on r615 (docs/node-side.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.mpsdaemon.mpscontrol import Control, number
from app.core import log

_log = log.get("gpupack.agent.mpsv3")

SERVER = "gpupack"


@dataclass(frozen=True, slots=True)
class Namespaces:
    binary: str  # the control client (nvidia-cuda-mps-control), a path or a name on PATH
    pipe_dir: Path
    server: str = SERVER
    timeout_s: float = 5.0

    def _run(self, *argv: str) -> tuple[bool, str]:
        reply = Control(self.binary, self.pipe_dir, self.timeout_s).args(*argv)
        return reply.ok, reply.text

    def directory(self, namespace: str) -> Path:
        return self.pipe_dir / self.server / namespace

    def ensure_server(self) -> str:
        """The named server exists ("" ) or why it cannot be made."""
        ok, text = self._run("server", "list")
        if not ok:
            return f"MPS v3 `server list` failed: {text}"
        if self.server in text.split():
            return ""
        ok, text = self._run("server", "create", self.server, "--uid=0")
        return "" if ok else f"MPS v3 `server create {self.server}` failed: {text}"

    def create(self, namespace: str, thread_percentage: int, pinned_mib: int) -> Path | str:
        """The container's namespace with both limits set; its directory, or why not (a half-made one is
        deleted)."""
        why = self.ensure_server()
        if why:
            return why
        ok, text = self._run("namespace", "create", namespace, f"--server={self.server}")
        if not ok:
            return f"MPS v3 `namespace create {namespace}` failed: {text}"
        ok, text = self._run(
            "namespace", "set", namespace, f"--server={self.server}",
            f"--pinned-memory-limit={pinned_mib}M", f"--active-thread-percentage={thread_percentage}",
        )  # fmt: skip
        if not ok:
            self.delete(namespace)
            return f"MPS v3 `namespace set {namespace}` failed: {text}"
        held = self.limits(namespace)
        if held != (float(pinned_mib), float(thread_percentage)):
            self.delete(namespace)
            return (
                f"MPS v3 namespace {namespace} did not keep its limits: asked {pinned_mib}M and "
                f"{thread_percentage} %, `namespace list` says {held}"
            )
        directory = self.directory(namespace)
        if not (directory / "control").exists():
            self.delete(namespace)
            return f"MPS v3 namespace {namespace} has no control socket at {directory}"
        return directory

    def delete(self, namespace: str) -> str:
        """Delete the namespace, dropping any client still attached; "" or why not."""
        ok, text = self._run("namespace", "delete", namespace, f"--server={self.server}", "--force")
        if not ok and "no namespace" not in text:
            _log.warning("MPS v3 namespace not deleted", extra={"namespace": namespace, "error": text})
            return text
        return ""

    def _rows(self) -> list[list[str]]:
        """`namespace list --format=csv,noheader`: server, namespace, pinned limit, thread percentage."""
        ok, text = self._run("namespace", "list", "--format=csv,noheader")
        if not ok:
            return []
        return [line.split(",") for line in text.splitlines() if line.strip()]

    def listed(self) -> list[str]:
        """Namespaces of this server."""
        return [r[1] for r in self._rows() if len(r) > 1 and r[0] == self.server and r[1] != "default"]

    def limits(self, namespace: str) -> tuple[float | None, float | None] | None:
        """(pinned MiB, thread percentage) of a namespace of this server as the daemon reports them."""
        for r in self._rows():
            if len(r) > 3 and r[0] == self.server and r[1] == namespace:
                return number(r[2]), number(r[3])
        return None
