"""The MPS control daemon's contract, as measured on a real GPU, asserted of any backend: the stand-in
(tests/standin/mps_control.py, in `make test`: tests/unit/test_mps_contract.py) and NVIDIA's binary (in
tests/gpu/test_gpu_mps_contract.py, on a lent GPU). Each check names the row of the measured table it
asserts (docs/node-side.md, "MPS as measured"), so the stand-in and the real thing cannot drift apart
unnoticed: what one of them fails here, the other does differently.

A backend starts a daemon on a pipe directory, runs control commands, and runs CUDA clients: a busy one
(work in flight until it finishes or fails) and one that reports how much it could allocate.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

CONTROL, PRIVILEGED = "control", "control_privileged"
CONTEXT_RESERVE_MIB = 514  # row "the CUDA context": 3000M -> 2 486 MiB, 2000M -> 1 486 MiB


@dataclass(frozen=True)
class Finished:
    ok: bool
    error: str  # the CUDA error the client failed with ("" when it finished its work)
    said: str


class Busy(Protocol):
    """A client with work in flight; `pid` is its process."""

    pid: int

    def result(self, timeout_s: float) -> Finished: ...

    def kill(self, sig: int) -> None: ...


class Backend(Protocol):
    name: str

    def start(self, pipe: Path) -> None:
        """A multi-user daemon in the background (`-d -M`) serving `pipe`, answering on return."""

    def control(self, pipe: Path, command: str) -> subprocess.CompletedProcess[str]:
        """The control binary with CUDA_MPS_PIPE_DIRECTORY=`pipe`, `command` on its stdin."""

    def busy(self, pipe: Path, seconds: float, env: Mapping[str, str] = {}) -> Busy:
        """A client attached to the daemon at `pipe` (returns once its context is up), busy for `seconds`."""

    def usable_mib(self, pipe: Path, env: Mapping[str, str]) -> int | None:
        """What one client could allocate with `env` (None: no limit reached)."""


def said(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stdout + " " + done.stderr).split())


def daemon_pid(pipe: Path) -> int:
    return int((pipe / "nvidia-cuda-mps-control.pid").read_text().split()[0])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (our child, not reaped) is gone as far as the GPU is concerned
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def wait_until(pred: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def pod_dir(pipe: Path, name: str = "pod") -> Path:
    """A directory holding only a hard link to `control`, as gpupack gives a pod
    (agent.mpsdaemon.pipedirs)."""
    d = pipe.parent / f"{pipe.name}-{name}"
    d.mkdir(exist_ok=True)
    os.link(pipe / CONTROL, d / CONTROL)
    return d


# --- "The control socket" ---


def check_control_socket_is_seqpacket(backend: Backend, pipe: Path) -> None:
    """Row "`<pipe dir>/control` socket type": SOCK_SEQPACKET; a stream connect fails with EPROTOTYPE."""
    backend.start(pipe)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(str(pipe / CONTROL))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(pipe / CONTROL))
        except OSError as exc:
            assert exc.errno == errno.EPROTOTYPE, exc
        else:
            raise AssertionError(f"{backend.name}: a stream connect to control succeeded")


def check_pipe_dir_has_both_control_sockets(backend: Backend, pipe: Path) -> None:
    """Row "pipe dir after `nvidia-cuda-mps-control -d -M`": control srw-rw-rw-, control_privileged
    srwxr-xr-x owned by root."""
    backend.start(pipe)
    control, privileged = os.stat(pipe / CONTROL), os.stat(pipe / PRIVILEGED)
    assert stat.S_ISSOCK(control.st_mode) and stat.S_IMODE(control.st_mode) == 0o666, oct(control.st_mode)
    assert stat.S_ISSOCK(privileged.st_mode) and stat.S_IMODE(privileged.st_mode) == 0o755, oct(
        privileged.st_mode
    )
    assert privileged.st_uid == 0


def check_a_pod_directory_reads_but_cannot_change_or_quit(backend: Backend, pipe: Path) -> None:
    """Row "control commands through that pod dir": get_server_list answers; a setting is refused with
    "Insufficient privileges for UID N"; quit with "Not enough privilege"; row "exit status ... when it
    refuses a command": 0. The daemon still serves afterwards."""
    backend.start(pipe)
    d = pod_dir(pipe)
    listed = backend.control(d, "get_server_list")
    assert listed.returncode == 0 and all(w.isdigit() for w in listed.stdout.split()), said(listed)
    setting = backend.control(d, "set_default_active_thread_percentage 10")
    assert setting.returncode == 0, said(setting)
    assert f"Insufficient privileges for UID {os.geteuid()}" in said(setting), said(setting)
    quit_ = backend.control(d, "quit")
    assert quit_.returncode == 0 and "Not enough privilege to execute quit command" in said(quit_), said(
        quit_
    )
    assert backend.control(pipe, "get_server_list").returncode == 0
    kept = backend.control(pipe, "get_default_active_thread_percentage")
    assert float(kept.stdout.split()[-1]) != 10, said(kept)


# --- "Lifetimes" ---


def check_the_daemons_death_takes_its_server_and_clients(backend: Backend, pipe: Path) -> None:
    """Row "SIGKILL or SIGTERM of the control daemon": its server exits within 3 s; a running client fails
    (CUDA_ERROR_MPS_RPC_FAILURE)."""
    backend.start(pipe)
    client = backend.busy(pipe, 60)
    servers = [int(p) for p in backend.control(pipe, "get_server_list").stdout.split()]
    assert servers, "no server after a client attached"
    os.kill(daemon_pid(pipe), signal.SIGKILL)
    assert wait_until(lambda: not any(alive(p) for p in servers), 5), (
        f"server(s) {servers} outlived the daemon"
    )
    done = client.result(30)
    assert not done.ok, done.said


def check_a_client_without_a_daemon_runs_without_limits(backend: Backend, pipe: Path) -> None:
    """Row "a new client while the daemon is dead": it runs without MPS, no limits, no error: a pinned
    limit in its env is not applied."""
    backend.start(pipe)
    os.kill(daemon_pid(pipe), signal.SIGKILL)
    wait_until(lambda: not alive(daemon_pid(pipe)), 5)
    got = backend.usable_mib(pipe, {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2000M"})
    assert got is None or got > 2000, f"{backend.name}: a client of a dead daemon was held to {got} MiB"


def check_a_busy_client_killed_breaks_its_neighbour_unless_terminated_first(
    backend: Backend, pipe: Path
) -> None:
    """Rows "SIGKILL or SIGTERM of one MPS client with kernels in flight" (the others fail with
    cudaErrorIllegalAddress) and "`terminate_client` first, then SIGKILL" (the others finish); "after
    either": the server is not wedged."""
    backend.start(pipe)
    victim, neighbour = backend.busy(pipe, 120), backend.busy(pipe, 8)
    victim.kill(signal.SIGKILL)
    hit = neighbour.result(60)
    assert not hit.ok and "illegaladdress" in hit.error.replace("_", "").lower(), hit.said
    victim, neighbour = backend.busy(pipe, 120), backend.busy(pipe, 8)  # not wedged: new clients run
    (server,) = [int(p) for p in backend.control(pipe, "get_server_list").stdout.split()]
    ended = backend.control(pipe, f"terminate_client {server} {victim.pid}")
    assert ended.returncode == 0, said(ended)
    assert wait_until(
        lambda: str(victim.pid) not in backend.control(pipe, f"get_client_list {server}").stdout.split(), 10
    )
    victim.kill(signal.SIGKILL)
    spared = neighbour.result(60)
    assert spared.ok, spared.said


# --- "Limits" ---


def check_the_context_counts_against_the_pinned_limit(backend: Backend, pipe: Path) -> None:
    """Row "same, `0=3000M` / `0=2000M` (driver API, cuMemAlloc)": 2 486 / 1 486 MiB."""
    backend.start(pipe)
    for limit in (3000, 2000):
        got = backend.usable_mib(pipe, {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit}M"})
        want = limit - CONTEXT_RESERVE_MIB
        assert got is not None and abs(got - want) <= 0.02 * limit, f"{limit}M: {got} MiB, measured {want}"


CHECKS = (
    check_control_socket_is_seqpacket,
    check_pipe_dir_has_both_control_sockets,
    check_a_pod_directory_reads_but_cannot_change_or_quit,
    check_the_daemons_death_takes_its_server_and_clients,
    check_a_client_without_a_daemon_runs_without_limits,
    check_a_busy_client_killed_breaks_its_neighbour_unless_terminated_first,
    check_the_context_counts_against_the_pinned_limit,
)
