"""agent.mpsdaemon.pipedirs against real unix sockets: each pod's directory reaches the daemon, and only
it."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.mpsdaemon.pipedirs import PipeDirs


@pytest.fixture
def pipe(tmp_path: Path) -> Path:
    return tmp_path / "mps"


def listen(path: Path, kind: int = socket.SOCK_SEQPACKET) -> socket.socket:
    """A stand-in for the MPS control daemon's socket: it accepts connections and serves nothing. Its type
    is the daemon's, SOCK_SEQPACKET (docs/node-side.md, "MPS as measured": "`control` socket type")."""
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, kind)
    s.bind(str(path))
    s.listen(8)
    return s


@pytest.fixture
def daemon(pipe: Path) -> Iterator[socket.socket]:
    s = listen(pipe / "control")
    yield s
    s.close()


def reaches(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as c:
        try:
            c.connect(str(path))
        except OSError:
            return False
    return True


def test_pod_directory_holds_only_a_live_link_to_the_daemon(pipe: Path, daemon: socket.socket) -> None:
    (pipe / "other-file").write_text("not for tenants")
    d = PipeDirs(pipe).ensure("uid-a")
    assert isinstance(d, Path) and d == pipe / "pods" / "uid-a"
    assert sorted(p.name for p in d.iterdir()) == ["control"]
    assert reaches(d / "control")
    assert os.stat(d / "control").st_ino == os.stat(pipe / "control").st_ino


def test_each_pod_gets_its_own_directory(pipe: Path, daemon: socket.socket) -> None:
    dirs = PipeDirs(pipe)
    a, b = dirs.ensure("uid-a"), dirs.ensure("uid-b")
    assert isinstance(a, Path) and isinstance(b, Path) and a != b
    assert not (a / "uid-b").exists() and a.parent == b.parent


def test_a_seqpacket_daemon_is_up_and_a_stream_socket_is_not_the_daemon(pipe: Path) -> None:
    """The probe speaks the daemon's socket type: against a SOCK_SEQPACKET `control` it finds the daemon up
    (a stream probe gets EPROTOTYPE there, and every MPS pod would wait for ever)."""
    seq = listen(pipe / "control")
    try:
        assert PipeDirs(pipe).backend_down() == ""
        assert isinstance(PipeDirs(pipe).ensure("uid-1"), Path)
    finally:
        seq.close()
    (pipe / "control").unlink()
    stream = listen(pipe / "control", socket.SOCK_STREAM)
    try:
        assert "Protocol wrong type for socket" in PipeDirs(pipe).backend_down()
    finally:
        stream.close()


def test_no_daemon_is_a_reason_not_a_directory(pipe: Path) -> None:
    out = PipeDirs(pipe).ensure("uid-a")
    assert isinstance(out, str)
    assert f"the MPS control daemon does not answer at {pipe / 'control'}" in out
    assert not (pipe / "pods" / "uid-a").exists()


def test_a_socket_nobody_listens_on_is_down(pipe: Path) -> None:
    s = listen(pipe / "control")
    s.close()  # the file stays, the daemon is gone
    out = PipeDirs(pipe).ensure("uid-a")
    assert isinstance(out, str) and "Connection refused" in out


def test_links_follow_a_restarted_daemon(pipe: Path) -> None:
    first = listen(pipe / "control")
    dirs = PipeDirs(pipe)
    d = dirs.ensure("uid-a")
    assert isinstance(d, Path)
    first.close()
    (pipe / "control").unlink()
    second = listen(pipe / "control")  # a new socket inode, as a restarted daemon makes
    try:
        assert not reaches(d / "control")
        dirs.refresh()
        assert reaches(d / "control")
    finally:
        second.close()


def test_prune_removes_only_old_directories_of_pods_gone(pipe: Path, daemon: socket.socket) -> None:
    dirs = PipeDirs(pipe)
    for uid in ("keep", "gone", "young"):
        assert isinstance(dirs.ensure(uid), Path)
    old = (pipe / "pods" / "gone").stat().st_mtime
    os.utime(pipe / "pods" / "keep", (old - 600, old - 600))
    os.utime(pipe / "pods" / "gone", (old - 600, old - 600))
    assert dirs.prune({"keep"}, older_than_s=60, now=old) == ["gone"]
    assert sorted(p.name for p in (pipe / "pods").iterdir()) == ["keep", "young"]


@pytest.mark.parametrize("uid", ["", "..", "a/b"])
def test_a_uid_that_is_no_directory_name_is_refused(pipe: Path, daemon: socket.socket, uid: str) -> None:
    assert isinstance(PipeDirs(pipe).ensure(uid), str)
