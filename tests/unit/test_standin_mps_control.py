"""The stand-in MPS control daemon (tests/standin/mps_control.py) behaves as the node side relies on."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "mps_control.py"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="clients of other uids need root")


@pytest.fixture
def pipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # Under /tmp and world-searchable (pytest's tmp_path is 0700 root): clients of other uids reach it.
    root = Path(tempfile.mkdtemp(prefix="standin-mps-", dir="/tmp"))
    root.chmod(0o755)
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(root / "pipe"))
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", str(root / "log"))
    yield root / "pipe"
    control("quit")
    deadline = time.monotonic() + 5
    while (root / "pipe" / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(root, ignore_errors=True)


def start(*flags: str) -> None:
    argv = [sys.executable, str(STANDIN), "-d", *flags]
    done = subprocess.run(argv, capture_output=True, timeout=20, check=False)
    assert done.returncode == 0, done.stderr


def control(*commands: str) -> subprocess.CompletedProcess[str]:
    stdin = "".join(f"{c}\n" for c in commands)
    return subprocess.run(
        [sys.executable, str(STANDIN)], input=stdin, capture_output=True, text=True, timeout=20, check=False
    )


def servers() -> list[int]:
    return [int(p) for p in control("get_server_list").stdout.split()]


def clients(server: int) -> list[int]:
    return [int(p) for p in control(f"get_client_list {server}").stdout.split()]


class Client:
    """A stand-in CUDA client forked as `uid` (no exec: the interpreter need not be readable by it)."""

    def __init__(self, uid: int, hold: bool = True, timeout: float = 10) -> None:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            rc = 99
            try:
                os.close(read)
                sys.stdout = os.fdopen(write, "w")  # not fd 1: pytest's capture replaced sys.stdout
                if uid != os.geteuid():
                    os.setgid(uid)
                    os.setuid(uid)
                sys.path.insert(0, str(STANDIN.parent))
                import mps_control

                rc = mps_control.client(hold, timeout)
            finally:
                os._exit(rc)
        os.close(write)
        self.pid = pid
        self._out = os.fdopen(read)

    def line(self) -> str:
        return self._out.readline().strip()

    def stop(self) -> int:
        os.kill(self.pid, signal.SIGTERM)
        return self.wait()

    def wait(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


def test_control_client_answers_and_keeps_defaults(pipe: Path) -> None:
    start()
    done = control(
        "set_default_active_thread_percentage 50",
        "get_default_active_thread_percentage",
        "set_default_device_pinned_mem_limit GPU-1 2048M",
        "get_default_device_pinned_mem_limit GPU-1",
        "get_server_list",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["50.0", "50.0", "2048M"]
    refused = control("set_default_device_pinned_mem_limit 0 lots")
    assert refused.returncode == 0  # the daemon answered: only its words tell an error (as measured)
    assert "'lots' must be a number with K, M or G" in refused.stderr


def test_no_daemon_means_exit_1_for_control_and_a_client_without_mps(pipe: Path) -> None:
    assert control("get_server_list").returncode == 1
    c = Client(os.geteuid(), hold=False)
    assert c.line() == "direct context: no MPS, whole GPU, no limits"
    assert c.wait() == 0


def test_a_held_client_is_listed_by_its_peer_pid_until_it_exits(pipe: Path) -> None:
    start()
    c = Client(os.geteuid())
    server = int(c.line().split()[1])
    assert servers() == [server]
    assert clients(server) == [c.pid]  # SO_PEERCRED: the client's own pid
    assert c.stop() == 0
    deadline = time.monotonic() + 5
    while clients(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert clients(server) == []
    assert servers() == [server]  # a server outlives its last client


def test_quit_ends_servers_and_drops_held_clients(pipe: Path) -> None:
    start()
    c = Client(os.geteuid())
    server = int(c.line().split()[1])
    control("quit")
    assert c.line() == f"lost server {server} CUDA_ERROR_MPS_RPC_FAILURE"
    assert c.wait() == 1


@needs_root
def test_without_multiuser_a_second_uid_waits_for_the_first_uids_clients(pipe: Path) -> None:
    start()
    first = Client(0)
    first_server = int(first.line().split()[1])
    second = Client(1000, timeout=2)
    assert second.line() == "waiting"  # serialized: uid 1000 gets no server while uid 0's has a client
    assert second.wait() == 4
    assert first.stop() == 0
    third = Client(1000)
    line = third.line().split()
    assert line[3] == "1000" and int(line[1]) != first_server
    assert servers() == [int(line[1])]
    assert control(f"get_server_uid {line[1]}").stdout.strip() == "1000"
    third.stop()


@needs_root
def test_multiuser_serves_two_uids_at_once_from_one_root_server(pipe: Path) -> None:
    start("-M")
    a, b = Client(0), Client(1000)
    line_a, line_b = a.line().split(), b.line().split()
    assert line_a[1] == line_b[1] and line_a[3] == line_b[3] == "0"
    assert sorted(clients(int(line_a[1]))) == sorted([a.pid, b.pid])
    assert control(f"get_client_uid {b.pid}").stdout.strip() == "1000"
    a.stop()
    b.stop()


def v3(*argv: str) -> subprocess.CompletedProcess[str]:
    """One MPS v3 command, given as arguments as r615's CLI takes them."""
    return subprocess.run(
        [sys.executable, str(STANDIN), *argv], capture_output=True, text=True, timeout=20, check=False
    )


def attach(directory: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(directory))
    argv = [sys.executable, str(STANDIN), "client", "--hold", "--timeout", "10"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)


def test_v3_named_namespaces_have_their_own_limits_directory_and_clients(pipe: Path) -> None:
    start("-m", "-p", "3")
    wrong_uid = v3("server", "create", "gpupack", "--uid=1000")  # multi-user: root servers only
    assert "runs as --uid=0 only" in wrong_uid.stderr and v3("server", "list").stdout == ""
    assert v3("server", "create", "gpupack").returncode == 0
    assert v3("namespace", "create", "c_1", "--server=gpupack").returncode == 0
    # a named namespace inherits nothing: without its own limits it has the whole GPU
    assert v3("namespace", "get", "c_1", "gpupack", "pinned-memory-limit").stdout.strip() == "unlimited"
    done = v3("namespace", "set", "c_1", "--server=gpupack", "--pinned-memory-limit=8192M",
              "--active-thread-percentage=50")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert v3("namespace", "list", "--format=csv,noheader").stdout.splitlines() == [
        "gpupack,default,unlimited,100",
        "gpupack,c_1,8192M,50",
    ]
    directory = pipe / "gpupack" / "c_1"
    assert [p.name for p in directory.iterdir()] == ["control"]
    client = attach(directory)  # routed by the directory it was given
    assert client.stdout is not None
    line = client.stdout.readline().strip()
    assert line.endswith("namespace gpupack/c_1 pinned 8192M threads 50"), line
    refused = v3("namespace", "delete", "c_1", "--server=gpupack")
    assert "has clients" in refused.stderr
    assert v3("namespace", "delete", "c_1", "--server=gpupack", "--force").returncode == 0
    assert client.wait(10) == 1  # its connection dropped with the namespace
    assert not directory.exists()
    assert v3("namespace", "list", "--format=csv,noheader").stdout.splitlines() == [
        "gpupack,default,unlimited,100"
    ]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("namespace", "create", "Bad-Name", "--server=gpupack"), "lowercase letters, digits and _ only"),
        (("namespace", "create", "x" * 65, "--server=gpupack"), "at most 64"),
        (("namespace", "create", "c_1"), "needs --server=<name>"),
        (
            ("namespace", "set", "c_9", "--server=gpupack", "--active-thread-percentage=50"),
            "no namespace 'c_9'",
        ),
        (
            ("namespace", "set", "c_1", "--server=gpupack", "--active-thread-percentage=0"),
            "must be in 1..100",
        ),
        (("namespace", "set", "c_1", "--server=gpupack", "--pinned-memory-limit=4Gi"), "K, M or G"),
        (("namespace", "delete", "default", "--server=gpupack"), "cannot be deleted"),
        (("namespace", "create", "c_1", "--server=nope"), "no server named 'nope'"),
    ],
)
def test_v3_commands_are_checked_with_the_rule_named(pipe: Path, argv: tuple[str, ...], said: str) -> None:
    start("-p", "3")
    assert v3("server", "create", "gpupack").returncode == 0
    assert v3("namespace", "create", "c_1", "--server=gpupack").returncode == 0
    done = v3(*argv)
    assert done.returncode == 0 and said in done.stderr, done.stderr  # answered: exit 0


def test_v3_commands_need_a_v3_daemon_and_the_env_var_wins(
    pipe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    start()
    assert "need MPS v3" in v3("server", "list").stderr
    control("quit")
    deadline = time.monotonic() + 5
    while (pipe / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    monkeypatch.setenv("CUDA_MPS_PROTOCOL_VERSION", "3")
    start("-p", "2")
    assert v3("server", "list").returncode == 0
