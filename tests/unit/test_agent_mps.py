"""The agent adopts the MPS daemon of its own pod and never stops or restarts it (the stand-in daemon here).

The daemon is tests/standin/mps_control.py, a stand-in for nvidia-cuda-mps-control: a real process with a
control socket, servers and long-lived clients, run as its own pod would run it (not by the agent).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.mpsdaemon.mps import Device, MpsConfig, MpsState, MpsSupervisor

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "mps_control.py"
DEVS = [Device("GPU-a", 15109), Device("GPU-b", 22491)]


@pytest.fixture
def cfg() -> Iterator[MpsConfig]:
    root = Path(tempfile.mkdtemp(prefix="agent-mps-", dir="/tmp"))
    config = MpsConfig(binary=str(STANDIN), pipe_dir=root / "pipe", command_timeout_s=20)
    yield config
    run(config, "quit")
    deadline = time.monotonic() + 5
    while (config.pipe_dir / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(root, ignore_errors=True)


def env(cfg: MpsConfig) -> dict[str, str]:
    return dict(
        os.environ, CUDA_MPS_PIPE_DIRECTORY=str(cfg.pipe_dir), CUDA_MPS_LOG_DIRECTORY=str(cfg.pipe_dir)
    )


def daemon(cfg: MpsConfig) -> None:
    """Start the stand-in daemon as the MPS daemon pod does (not through the agent)."""
    done = subprocess.run(
        [sys.executable, str(STANDIN), "-d", "-M"], env=env(cfg), capture_output=True, timeout=20, check=False
    )
    assert done.returncode == 0, done.stderr


def run(cfg: MpsConfig, command: str) -> str:
    done = subprocess.run(
        [sys.executable, str(STANDIN)], input=command + "\n", env=env(cfg), capture_output=True, text=True,
        timeout=20, check=False,
    )  # fmt: skip
    return done.stdout.strip()


def client(cfg: MpsConfig) -> tuple[subprocess.Popen[str], int]:
    """A stand-in CUDA client holding its connection; returns it and its server's pid."""
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN), "client", "--hold"], env=env(cfg), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line[0] == "server", line
    return proc, int(line[1])


def test_no_daemon_reads_starting_with_isolation_none_and_nothing_started(cfg: MpsConfig) -> None:
    sup = MpsSupervisor(cfg)
    st = sup.tick(DEVS, 0.0)
    assert (st.state, st.isolation) == ("starting", "none")
    assert "no MPS control daemon answers at" in st.message
    assert not (cfg.pipe_dir / "control").exists()  # the agent never starts a daemon


def test_adopts_the_daemon_and_sets_its_defaults(cfg: MpsConfig) -> None:
    daemon(cfg)
    sup = MpsSupervisor(
        MpsConfig(binary=cfg.binary, pipe_dir=cfg.pipe_dir, default_thread_percentage=40,
                  default_pinned_mem_limit_mib=8192)
    )  # fmt: skip
    st = sup.tick(DEVS, 0.0)
    assert (st.state, st.isolation, st.message) == ("running", "mps", "")
    assert run(cfg, "get_default_active_thread_percentage") == "40.0"
    assert run(cfg, "get_default_device_pinned_mem_limit GPU-b") == "8192M"


def test_a_new_agent_and_a_changed_gpu_set_leave_servers_and_clients_alone(cfg: MpsConfig) -> None:
    daemon(cfg)
    proc, server = client(cfg)
    try:
        first = MpsSupervisor(cfg)
        assert first.tick(DEVS, 0.0).state == "running"
        del first  # the agent process ends (upgrade, SIGKILL): nothing is sent to the daemon
        second = MpsSupervisor(cfg)
        assert second.tick(DEVS, 10.0).state == "running"
        assert second.tick(DEVS[:1], 20.0).state == "running"  # GPU-b left MPS (unhealthy): no restart
        assert second.restarts == 0
        assert run(cfg, "get_server_list") == str(server)
        assert run(cfg, f"get_client_list {server}") == str(proc.pid)
        assert proc.poll() is None  # the client still holds its connection
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_restarted_daemon_gets_the_defaults_again_and_counts_as_a_restart(cfg: MpsConfig) -> None:
    daemon(cfg)
    sup = MpsSupervisor(MpsConfig(binary=cfg.binary, pipe_dir=cfg.pipe_dir, default_thread_percentage=30))
    assert sup.tick(DEVS, 0.0).state == "running"
    run(cfg, "quit")
    deadline = time.monotonic() + 5
    while (cfg.pipe_dir / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sup.tick(DEVS, 5.0).state == "starting"
    daemon(cfg)  # its pod restarted it
    assert sup.tick(DEVS, 10.0).state == "running"
    assert run(cfg, "get_default_active_thread_percentage") == "30.0"
    assert sup.restarts == 0  # not seen to replace a running one: it was gone in between
    run(cfg, "quit")
    while (cfg.pipe_dir / "control").exists() and time.monotonic() < deadline + 5:
        time.sleep(0.05)
    daemon(cfg)  # replaced between two cycles
    assert sup.tick(DEVS, 15.0).state == "running"
    assert sup.restarts == 1
    assert run(cfg, "get_default_active_thread_percentage") == "30.0"


def test_no_binary_means_unavailable(cfg: MpsConfig, caplog: pytest.LogCaptureFixture) -> None:
    sup = MpsSupervisor(MpsConfig(binary="/nonexistent/nvidia-cuda-mps-control", pipe_dir=cfg.pipe_dir))
    for t in (0.0, 5.0, 10.0):
        st = sup.tick(DEVS, t)
    assert (st.state, st.isolation) == ("unavailable", "none")
    assert not sup.available()
    assert sum("MPS control daemon" in r.getMessage() for r in caplog.records) == 1  # once, not per cycle


def test_disabled_or_no_shared_gpus(cfg: MpsConfig) -> None:
    daemon(cfg)
    off = MpsSupervisor(MpsConfig(enabled=False, binary=cfg.binary, pipe_dir=cfg.pipe_dir))
    assert off.tick(DEVS, 0.0).message == "disabled by config"
    sup = MpsSupervisor(cfg)
    assert sup.tick(DEVS, 0.0).state == MpsState.RUNNING
    assert sup.tick([], 5.0).message == "no shared GPUs"
    assert run(cfg, "get_server_list").isdigit()  # still answering: the daemon was left running
    assert (cfg.pipe_dir / "control").exists()


def test_a_refused_default_is_an_error_with_the_daemons_words_and_no_mps_client_may_start(
    cfg: MpsConfig,
) -> None:
    """The control binary exits 0 when the daemon refuses (docs/node-side.md, "MPS as measured": "exit
    status of nvidia-cuda-mps-control when it refuses a command"). An agent that can reach only `control`
    (as through a pod's directory) is refused its defaults: it must say so, not report MPS running."""
    daemon(cfg)
    linked = cfg.pipe_dir.parent / "only-control"
    linked.mkdir()
    os.link(cfg.pipe_dir / "control", linked / "control")  # no control_privileged beside it
    sup = MpsSupervisor(MpsConfig(binary=cfg.binary, pipe_dir=linked, default_thread_percentage=40))
    st = sup.tick(DEVS, 0.0)
    assert (st.state, st.isolation) == ("starting", "none")
    assert (
        "Insufficient privileges for UID" in st.message
        and "set_default_active_thread_percentage" in st.message
    )
    assert "Insufficient privileges" in sup.not_ready()
    assert run(cfg, "get_default_active_thread_percentage") == "100.0"  # the daemon kept its own


def test_a_default_the_daemon_does_not_keep_is_an_error(cfg: MpsConfig, tmp_path: Path) -> None:
    """Exit 0 and no words of refusal are not enough: the value read back must be the one set."""
    daemon(cfg)
    forgetful = tmp_path / "forgetful-control"
    forgetful.write_text(
        "#!/bin/sh\n"
        'read -r line; case "$line" in set_*) exit 0 ;; get_default_active*) echo 100.0 ;; '
        f'*) echo "$line" | {sys.executable} {STANDIN} ;; esac\n'
    )
    forgetful.chmod(0o755)
    sup = MpsSupervisor(MpsConfig(binary=str(forgetful), pipe_dir=cfg.pipe_dir, default_thread_percentage=40))
    st = sup.tick(DEVS, 0.0)
    assert st.state == "starting"
    assert "did not hold" in st.message and "'100.0'" in st.message, st.message


def test_the_node_side_may_start_mps_clients_only_on_the_daemon_it_configured(cfg: MpsConfig) -> None:
    sup = MpsSupervisor(cfg)
    assert "not ready" in sup.not_ready()  # never checked
    daemon(cfg)
    assert sup.tick(DEVS, 0.0).state == "running"
    assert sup.not_ready() == ""
    run(cfg, "quit")
    deadline = time.monotonic() + 5
    while (cfg.pipe_dir / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    daemon(cfg)  # replaced between two cycles: it has none of the agent's defaults yet
    # The container asking is not refused on the loop's last cycle: the new daemon is configured first.
    assert sup.not_ready() == ""
    assert run(cfg, "get_default_active_thread_percentage") == "100.0" and sup.restarts == 1
    assert run(cfg, "get_server_list").isdigit()  # pre-started before the first client
    # The loop's next cycle still hears that the daemon it saw running was lost (its clients died with it).
    assert sup.tick(DEVS, 5.0).state == "running" and sup.lost
    assert sup.tick(DEVS, 10.0).state == "running" and not sup.lost


def test_a_daemon_that_came_up_since_the_last_cycle_serves_the_next_container(cfg: MpsConfig) -> None:
    """The loop checks the daemon every few seconds; a pod created just after the daemon's pod came up must
    not fail for good (restartPolicy Never) on the check from before: the daemon is checked again."""
    renewed: list[int] = []
    sup = MpsSupervisor(MpsConfig(binary=cfg.binary, pipe_dir=cfg.pipe_dir, default_thread_percentage=60))
    sup.on_new_daemon(lambda: renewed.append(1))
    assert sup.tick(DEVS, 0.0).state == "starting"
    assert "no MPS control daemon answers" in sup.not_ready()  # still none: checked again, still refused
    daemon(cfg)
    assert sup.not_ready() == ""
    assert run(cfg, "get_default_active_thread_percentage") == "60.0"  # configured before the client
    assert run(cfg, "get_server_list").isdigit() and renewed == [1]
    assert sup.status().state == "running" and sup.tick(DEVS, 5.0).state == "running" and not sup.lost
    assert renewed == [1]


def test_a_supervisor_the_loop_never_ran_checks_nothing_for_the_node_side(cfg: MpsConfig) -> None:
    """Before the loop's first cycle the agent does not know the node's shared GPUs: nothing to configure."""
    daemon(cfg)
    sup = MpsSupervisor(cfg)
    assert "not checked yet" in sup.not_ready()
    assert run(cfg, "get_server_list") == ""


def test_a_server_is_started_before_any_client_and_the_loss_of_the_daemon_is_seen(cfg: MpsConfig) -> None:
    """docs/node-side.md, "MPS as measured": EXCLUSIVE_PROCESS refuses a plain process only while a server
    runs, and `start_server -uid 0` right after the daemon starts closes that window. A daemon that dies takes
    every client with it: the cycle that finds it gone says so (`lost`), once."""
    daemon(cfg)
    renewed: list[int] = []
    sup = MpsSupervisor(cfg)
    sup.on_new_daemon(lambda: renewed.append(1))
    assert run(cfg, "get_server_list") == ""  # no client has come
    assert sup.tick(DEVS, 0.0).state == "running"
    (server,) = run(cfg, "get_server_list").split()
    assert run(cfg, f"get_server_uid {server}") == "0"
    assert renewed == [1] and not sup.lost
    assert sup.tick(DEVS, 5.0).state == "running" and renewed == [1]  # the same daemon: nothing new
    run(cfg, "quit")
    deadline = time.monotonic() + 5
    while (cfg.pipe_dir / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sup.tick(DEVS, 10.0).state == "starting" and sup.lost
    assert "not ready" in sup.not_ready()
    assert sup.tick(DEVS, 15.0).state == "starting" and not sup.lost  # told once
    daemon(cfg)
    assert sup.tick(DEVS, 20.0).state == "running" and renewed == [1, 1]
    assert run(cfg, "get_server_list").isdigit()


def test_without_prestart_no_server_is_started(cfg: MpsConfig) -> None:
    daemon(cfg)
    sup = MpsSupervisor(MpsConfig(binary=cfg.binary, pipe_dir=cfg.pipe_dir, prestart_server=False))
    assert sup.tick(DEVS, 0.0).state == "running"
    assert run(cfg, "get_server_list") == ""


def test_a_pods_link_to_the_socket_is_not_a_new_daemon(cfg: MpsConfig) -> None:
    """Each MPS pod's directory holds a hard link to `control`, which changes the socket's change time: that
    must not read as a restarted daemon (new MPS containers would be refused until the next cycle)."""
    daemon(cfg)
    sup = MpsSupervisor(cfg)
    assert sup.tick(DEVS, 0.0).state == "running"
    pod_dir = cfg.pipe_dir / "pods" / "uid-1"
    pod_dir.mkdir(parents=True)
    os.link(cfg.pipe_dir / "control", pod_dir / "control")
    assert sup.not_ready() == ""
    assert sup.tick(DEVS, 5.0).state == "running" and sup.restarts == 0 and not sup.lost


def test_new_defaults_on_a_daemon_whose_server_runs_are_said_to_wait_for_a_new_server(cfg: MpsConfig) -> None:
    """NVIDIA: a default changed while a server runs "will only affect the next server". A new agent with
    other defaults sets them, keeps the running server (its clients' contexts live there), and says that
    server still has the earlier ones, until it is gone; the next server is started with the new ones."""
    daemon(cfg)
    assert MpsSupervisor(cfg).tick(DEVS, 0.0).state == "running"
    (server,) = run(cfg, "get_server_list").split()
    same = MpsSupervisor(cfg)  # a restarted agent, same defaults: nothing changed
    assert same.tick(DEVS, 0.0).message == "" and same.stale_server is None
    changed = MpsSupervisor(
        MpsConfig(
            binary=cfg.binary, pipe_dir=cfg.pipe_dir, default_pinned_mem_limit_mib=8192, command_timeout_s=20
        )
    )
    status = changed.tick(DEVS, 0.0)
    assert status.state == "running" and changed.stale_server == int(server)
    assert f"MPS server {server} runs with the daemon's earlier defaults" in status.message
    assert run(cfg, "get_server_list").split() == [server]  # kept
    run(cfg, f"shutdown_server {server} -f")
    status = changed.tick(DEVS, 5.0)
    assert status.state == "running" and status.message == "" and changed.stale_server is None
    assert run(cfg, "get_server_list").split() not in ([], [server])  # a new server, with the new defaults
