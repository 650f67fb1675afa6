"""The node's MPS control daemon as a client sees it: the control binary run once per command, its answer
judged by what it says, never by its exit status alone.

Measured (docs/node-side.md, "MPS as measured"): `nvidia-cuda-mps-control` exits 0 when the daemon refuses
a command ("Insufficient privileges for UID N. ...", "Not enough privilege to execute quit command"), so a
reply is a failure when its words say so, and callers that change a setting read it back. Run as root on
the daemon's own pipe directory, the binary reaches `control_privileged`, where settings are accepted.
The exit status of other failures is unmeasured; a non-zero one is a failure too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from app.core import names

# What the daemon and the control binary say instead of doing what was asked (first two measured).
REFUSALS = (
    "Insufficient privileges",
    "Not enough privilege",
    "Cannot find MPS control daemon",
)
MIB_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


@dataclass(frozen=True, slots=True)
class Reply:
    ok: bool
    text: str  # what the daemon said (stdout), or why it failed

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Control:
    """`binary` (a path, or a name on PATH) run with CUDA_MPS_PIPE_DIRECTORY=`pipe_dir`."""

    binary: str
    pipe_dir: Path
    timeout_s: float = 5.0

    def found(self) -> str | None:
        return shutil.which(self.binary)

    def command(self, line: str) -> Reply:
        """One legacy command (`get_server_list`, `set_default_...`), written to the binary's stdin."""
        return self._run([], line + "\n")

    def args(self, *argv: str) -> Reply:
        """One MPS v3 command given as arguments (`namespace create ...`)."""
        return self._run(list(argv), "")

    def _run(self, argv: list[str], stdin: str) -> Reply:
        binary = self.found()
        if binary is None:
            return Reply(False, f"{self.binary} not found")
        env = dict(os.environ, **{names.ENV_MPS_PIPE_DIRECTORY: str(self.pipe_dir)})
        try:
            done = subprocess.run(
                [binary, *argv], input=stdin, env=env, capture_output=True, text=True,
                timeout=self.timeout_s, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return Reply(False, f"no answer within {self.timeout_s:g} s")
        except OSError as exc:
            return Reply(False, str(exc))
        said = " ".join((done.stdout + "\n" + done.stderr).split())
        refused = next((r for r in REFUSALS if r in said), None)
        if refused is not None or done.returncode != 0:
            why = said[:300] or f"exit {done.returncode}"
            return Reply(False, why if refused else f"exit {done.returncode}: {why}")
        return Reply(True, done.stdout.strip())

    # --- the legacy daemon's lists, and ending a client ---

    def server_list(self) -> list[int] | str:
        """The daemon's server pids, or why they cannot be had."""
        return self._pids(self.command("get_server_list"), "get_server_list")

    def client_list(self, server: int) -> list[int] | str:
        return self._pids(self.command(f"get_client_list {server}"), f"get_client_list {server}")

    def terminate_client(self, server: int, client: int) -> str:
        """Ask the daemon to end `client` of `server` ("" once asked, else why not)."""
        reply = self.command(f"terminate_client {server} {client}")
        return "" if reply.ok else f"terminate_client {server} {client}: {reply}"

    @staticmethod
    def _pids(reply: Reply, what: str) -> list[int] | str:
        if not reply.ok:
            return f"{what}: {reply}"
        words = reply.text.split()
        if not all(w.isdigit() for w in words):
            return f"{what}: unexpected answer {reply.text[:200]!r}"
        return [int(w) for w in words]


def number(text: str) -> float | None:
    """The last word of a daemon's answer as a number: a percentage (`50.0`) as it is, a memory limit
    (`2048M`, `2G`) in MiB; None when it is neither (`unlimited`, a message)."""
    value = text.strip().split()[-1] if text.strip() else ""
    unit = value[-1:].upper()
    number = value[:-1] if unit in MIB_UNITS else value
    try:
        amount = float(number)
    except ValueError:
        return None
    return amount * MIB_UNITS.get(unit, 1)
