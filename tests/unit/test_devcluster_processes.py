"""Dev cluster: managed processes (start, health wait, group stop with SIGKILL escalation) and polling."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.devcluster import (
    ComponentError,
    ComponentSpec,
    HealthCheck,
    ManagedProcess,
    WaitTimeoutError,
    processes,
    wait_for,
)
from tests.devcluster.ports import free_ports

PY = sys.executable
# Prints a line once its SIGTERM handler is installed, so the test knows the handler is live.
IGNORES_TERM = (
    "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    " print('ready', flush=True); time.sleep(60)"
)
SPAWNS_CHILD = (
    "import subprocess,sys,time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
    " print('child', c.pid, flush=True); time.sleep(60)"
)


def _started(tmp_path: Path, code: str, marker: str) -> ManagedProcess:
    log = tmp_path / "p.log"
    proc = processes.start(ComponentSpec("p", (PY, "-c", code)), log)
    # A line *starting* with the marker: the log's header line quotes the whole argv, marker included.
    wait_for(
        lambda: any(ln.startswith(marker) for ln in log.read_text().splitlines()), 10, f"{marker!r} line"
    )
    return proc


def test_stop_escalates_to_sigkill_when_term_is_ignored(tmp_path: Path) -> None:
    proc = _started(tmp_path, IGNORES_TERM, "ready")
    assert proc.alive() and proc.pid == os.getpgid(proc.pid)  # its own group, so killpg hits only it
    proc.stop(grace_s=0.5)
    assert not proc.alive()
    assert processes.group_members(proc.pid) == []
    assert proc.popen is not None and proc.popen.returncode == -9


def test_stop_takes_the_whole_group(tmp_path: Path) -> None:
    proc = _started(tmp_path, SPAWNS_CHILD, "child")
    child = int((tmp_path / "p.log").read_text().splitlines()[-1].split()[1])
    assert processes.group_members(proc.pid) == sorted([proc.pid, child])
    proc.stop(grace_s=5)
    assert not processes.pid_alive(child)
    assert processes.group_members(proc.pid) == []


def test_stop_of_a_stopped_process_is_a_no_op(tmp_path: Path) -> None:
    proc = _started(tmp_path, "print('bye', flush=True)", "bye")
    wait_for(lambda: not proc.alive(), 10, "exit")
    proc.stop()


def test_pid_with_other_start_time_is_not_ours(tmp_path: Path) -> None:
    proc = _started(tmp_path, IGNORES_TERM, "ready")
    try:
        assert processes.pid_alive(proc.pid, proc.ticks)
        assert not processes.pid_alive(proc.pid, proc.ticks + 1)  # what a reused pid looks like
    finally:
        proc.stop(grace_s=0.2)


def test_health_wait_fails_fast_with_the_log_tail(tmp_path: Path) -> None:
    spec = ComponentSpec(
        "crasher",
        (PY, "-c", "import sys; print('bad flag --frobnicate', flush=True); sys.exit(3)"),
        health=HealthCheck(f"http://127.0.0.1:{free_ports(1)[0]}/healthz"),
        ready_timeout_s=30,
    )
    with pytest.raises(ComponentError, match=r"(?s)crasher exited.*code 3.*bad flag --frobnicate"):
        processes.start_and_wait(spec, tmp_path / "crasher.log")


def test_health_wait_times_out_and_stops_the_process(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    spec = ComponentSpec(
        "mute",
        (PY, "-c", "import time; time.sleep(60)"),
        health=HealthCheck(f"http://127.0.0.1:{port}/x"),
        ready_timeout_s=0.5,
    )
    with pytest.raises(
        ComponentError, match=r"mute not healthy after 0s \(last probe: (ConnectionRefusedError|URLError)"
    ):
        processes.start_and_wait(spec, tmp_path / "mute.log")
    log = (tmp_path / "mute.log").read_text()
    assert log.startswith("==== ") and "start: " in log


def test_health_probe_against_a_closed_port_is_false() -> None:
    ok, detail = HealthCheck(f"http://127.0.0.1:{free_ports(1)[0]}/healthz").probe(timeout=0.5)
    assert not ok and "refused" in detail.lower()


def test_state_roundtrip_drops_the_popen_handle() -> None:
    proc = ManagedProcess(
        "etcd", 42, 7, "/l/etcd.log", ("etcd", "--x"), HealthCheck("http://h/health", expect="t")
    )
    raw = proc.to_json()
    assert raw == {
        "name": "etcd",
        "pid": 42,
        "ticks": 7,
        "log_path": "/l/etcd.log",
        "argv": ["etcd", "--x"],
        "health": {"url": "http://h/health", "ca_file": None, "token": None, "expect": "t"},
    }
    assert ManagedProcess.from_json(raw) == proc


def test_wait_for_returns_the_truthy_value() -> None:
    seen = iter([None, 0, "", "done"])
    assert wait_for(lambda: next(seen), 5, "value", interval=0) == "done"


def test_wait_for_names_what_and_last_value() -> None:
    with pytest.raises(WaitTimeoutError, match=r"waiting for pods bound; last value: \[\]"):
        wait_for(lambda: [], 0.05, "pods bound", interval=0.01)
