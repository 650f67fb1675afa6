"""MPS supervisor against a fake nvidia-cuda-mps-control: start, defaults, restart with backoff, no binary."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from agent.mps import Device, MpsConfig, MpsState, MpsSupervisor

# Behaves like the real control binary where the supervisor can tell: `-d` starts a background daemon
# (refusing a second one), a command on stdin fails when no daemon answers, `quit` stops it.
FAKE = f"""#!{sys.executable}
import os, subprocess, sys
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
pidfile = os.path.join(pipe, "control.pid")
def alive():
    try:
        pid = int(open(pidfile).read())
        return open(f"/proc/{{pid}}/stat").read().split(")")[-1].split()[0] != "Z", pid
    except (OSError, ValueError):
        return False, 0
up, pid = alive()
if sys.argv[1:] == ["-d"]:
    open(os.path.join(pipe, "starts.log"), "a").write("start\\n")
    if os.path.exists(os.path.join(pipe, "refuse-start")):
        print("cannot start", file=sys.stderr); sys.exit(1)
    if up:
        print("An instance of this daemon is already running", file=sys.stderr); sys.exit(1)
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    open(pidfile, "w").write(str(p.pid))
    open(os.path.join(pipe, "env.log"), "a").write(os.environ.get("CUDA_VISIBLE_DEVICES", "") + "\\n")
    sys.exit(0)
cmd = sys.stdin.read().strip()
if not up:
    sys.exit(1)
open(os.path.join(pipe, "commands.log"), "a").write(cmd + "\\n")
if cmd == "quit":
    os.kill(pid, 9)
"""

DEVS = [Device("GPU-a", 15109), Device("GPU-b", 22491)]


@pytest.fixture
def fake(tmp_path: Path) -> MpsConfig:
    binary = tmp_path / "bin" / "nvidia-cuda-mps-control"
    binary.parent.mkdir()
    binary.write_text(FAKE)
    binary.chmod(0o755)
    return MpsConfig(
        binary=str(binary), pipe_dir=tmp_path / "pipe", log_dir=tmp_path / "log", command_timeout_s=20
    )


def commands(cfg: MpsConfig) -> list[str]:
    path = cfg.pipe_dir / "commands.log"
    return path.read_text().splitlines() if path.exists() else []


def kill_daemon(cfg: MpsConfig) -> None:
    pid = int((cfg.pipe_dir / "control.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # wait until the kernel shows it dead (reaped or zombie)
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return
        except OSError:
            return
        time.sleep(0.02)


def test_starts_daemon_with_defaults_and_reports_running(fake: MpsConfig) -> None:
    sup = MpsSupervisor(fake)
    try:
        st = sup.tick(DEVS, 0.0)
        assert (st.state, st.isolation) == ("running", "mps")
        assert commands(fake) == [
            "get_server_list",
            "set_default_active_thread_percentage 100",
            "set_default_device_pinned_mem_limit 0 15109M",
            "set_default_device_pinned_mem_limit 1 22491M",
        ]
        assert (fake.pipe_dir / "env.log").read_text() == "GPU-a,GPU-b\n"
        sup.tick(DEVS, 5.0)
        assert commands(fake)[-1] == "get_server_list"  # a probe, no restart
    finally:
        sup.stop()
    assert commands(fake)[-1] == "quit"


def test_configured_caps_are_applied(fake: MpsConfig) -> None:
    from dataclasses import replace

    sup = MpsSupervisor(replace(fake, default_thread_percentage=50, default_pinned_mem_limit_mib=4096))
    try:
        sup.tick(DEVS[:1], 0.0)
        assert commands(fake)[1:] == [
            "set_default_active_thread_percentage 50",
            "set_default_device_pinned_mem_limit 0 4096M",
        ]
    finally:
        sup.stop()


def test_dead_daemon_is_restarted_after_backoff(fake: MpsConfig) -> None:
    sup = MpsSupervisor(fake)
    try:
        sup.tick(DEVS, 0.0)
        kill_daemon(fake)
        st = sup.tick(DEVS, 10.0)
        assert (st.state, st.isolation, st.restarts) == ("backoff", "none", 1)
        assert sup.tick(DEVS, 10.5).state == "backoff"  # backoff 1 s not over yet
        assert sup.tick(DEVS, 11.0).state == "running"
    finally:
        sup.stop()


def test_failed_starts_back_off_exponentially(fake: MpsConfig) -> None:
    fake.pipe_dir.mkdir(parents=True)
    (fake.pipe_dir / "refuse-start").touch()
    sup = MpsSupervisor(fake)
    st = sup.tick(DEVS, 0.0)
    assert st.state == "backoff" and "cannot start" in st.message
    tried = []
    starts = fake.pipe_dir / "starts.log"
    for t in range(1, 40):
        before = starts.read_text().count("start")
        sup.tick(DEVS, float(t))
        if starts.read_text().count("start") > before:
            tried.append(t)
    assert tried == [1, 3, 7, 15, 31]  # waits of 1, 2, 4, 8, 16 s: the backoff doubles
    (fake.pipe_dir / "refuse-start").unlink()
    assert sup.tick(DEVS, 100.0).state == "running"
    sup.stop()


def test_adopts_a_running_daemon(fake: MpsConfig) -> None:
    first = MpsSupervisor(fake)
    first.tick(DEVS, 0.0)
    second = MpsSupervisor(fake)  # e.g. the agent restarted, the daemon kept running
    try:
        assert second.tick(DEVS, 0.0).state == "running"
        assert (fake.pipe_dir / "env.log").read_text().count("\n") == 1  # started once
    finally:
        second.stop()


def test_gpu_set_change_restarts_the_daemon(fake: MpsConfig) -> None:
    sup = MpsSupervisor(fake)
    try:
        sup.tick(DEVS, 0.0)
        assert sup.tick(DEVS[:1], 1.0).state == "running"
        assert (fake.pipe_dir / "env.log").read_text().splitlines() == ["GPU-a,GPU-b", "GPU-a"]
    finally:
        sup.stop()


def test_no_binary_means_isolation_none_and_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sup = MpsSupervisor(
        MpsConfig(binary=str(tmp_path / "missing"), pipe_dir=tmp_path / "p", log_dir=tmp_path / "l")
    )
    for t in range(3):
        st = sup.tick(DEVS, float(t))
    assert (st.state, st.isolation) == ("unavailable", "none")
    assert not sup.available()
    assert sum("MPS unavailable" in r.message for r in caplog.records) == 1


def test_disabled_or_no_shared_gpus(fake: MpsConfig) -> None:
    from dataclasses import replace

    assert MpsSupervisor(replace(fake, enabled=False)).tick(DEVS, 0).state == MpsState.DISABLED
    assert MpsSupervisor(fake).tick([], 0).state == MpsState.DISABLED
    assert not (fake.pipe_dir / "env.log").exists()
