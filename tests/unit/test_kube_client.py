"""app.kube.client against real local sockets: each transport failure is one KubeError, within its timeout."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import kubernetes
import pytest
import urllib3

from app.core.errors import KubeError
from app.core.pods import SlimPod
from app.kube import calls
from app.kube.calls import Request
from app.kube.client import Kube, Timeouts, transport_error

Script = Callable[[socket.socket], None]
JsonEvent = dict[str, object]


class Server:
    """Accepts connections on 127.0.0.1 and runs `script` on each; closes everything on exit."""

    def __init__(self, script: Script) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.script = script
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            _read_request(conn)
            self.script(conn)
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self.sock.close()
        for c in self.conns:
            c.close()
        self.thread.join(timeout=5)


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def never_answer(conn: socket.socket) -> None:
    time.sleep(30)


def chunked_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def event(name: str, rv: str) -> bytes:
    obj = {"metadata": {"name": name, "resourceVersion": rv}}
    return json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n"


@pytest.fixture
def serve() -> Iterator[Callable[[Script], Kube]]:
    servers: list[Server] = []
    kubes: list[Kube] = []

    def start(script: Script) -> Kube:
        srv = Server(script)
        servers.append(srv)
        cfg = kubernetes.client.Configuration(host=f"http://127.0.0.1:{srv.port}")
        kube = Kube.from_configuration(cfg, Timeouts(connect_s=1.0, read_s=1.0, watch_margin_s=0.5))
        kubes.append(kube)
        return kube

    yield start
    for k in kubes:
        k.close()
    for s in servers:
        s.close()


GET = Request("GET", "/api/v1/namespaces/ns/pods/p")


def test_a_server_that_never_answers_times_out_within_the_read_timeout(
    serve: Callable[[Script], Kube],
) -> None:
    kube = serve(never_answer)
    t0 = time.monotonic()
    with pytest.raises(KubeError) as err:
        kube.send(GET)
    took = time.monotonic() - t0
    assert (err.value.code, err.value.reason) == (0, "Timeout")
    assert 0.9 <= took < 2.0  # one read timeout, no hidden urllib3 retries


def test_a_refused_connection_is_unreachable() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    kube = Kube.from_configuration(kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}"))
    with pytest.raises(KubeError) as err:
        kube.send(GET)
    assert (err.value.code, err.value.reason) == (0, "Unreachable")
    assert "refused" in err.value.message.lower()


def test_a_status_reply_keeps_the_api_code_and_reason(serve: Callable[[Script], Kube]) -> None:
    body = json.dumps({"kind": "Status", "code": 409, "reason": "Conflict", "message": "modified"}).encode()

    def conflict(conn: socket.socket) -> None:
        head = f"HTTP/1.1 409 Conflict\r\nContent-Length: {len(body)}\r\n\r\n"
        conn.sendall(head.encode() + body)

    with pytest.raises(KubeError) as err:
        serve(conflict).send(GET)
    assert (err.value.code, err.value.reason, err.value.message) == (409, "Conflict", "modified")


def test_a_reply_cut_short_is_unreachable(serve: Callable[[Script], Kube]) -> None:
    def truncated(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        conn.close()

    with pytest.raises(KubeError) as err:
        serve(truncated).send(GET)
    assert (err.value.code, err.value.reason) == (0, "Unreachable")


def test_a_reply_that_is_not_json_is_a_bad_response(serve: Callable[[Script], Kube]) -> None:
    def html(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 6\r\n\r\n<html>")

    with pytest.raises(KubeError) as err:
        serve(html).send(GET)
    assert (err.value.code, err.value.reason) == (0, "BadResponse")
    assert "not JSON" in err.value.message


def _reply(body: bytes) -> Script:
    def script(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)

    return script


LIST_PODS = calls.list_request("/api/v1/pods", "", 500, "", item_shape=SlimPod)


def test_a_list_page_comes_back_with_its_items_in_the_calls_shape(serve: Callable[[Script], Kube]) -> None:
    pod = {"metadata": {"name": "p", "managedFields": [{}]}, "spec": {"nodeName": "n", "volumes": []}}
    page = {"kind": "PodList", "metadata": {"continue": "c"}, "items": [pod]}
    got = serve(_reply(json.dumps(page).encode())).send(LIST_PODS)
    assert got == {
        "metadata": {"continue": "c"},
        "items": [{"metadata": {"name": "p"}, "spec": {"nodeName": "n"}}],
    }


@pytest.mark.parametrize(("body", "why"), [(b"<html>", "not JSON"), (b"[1]", "not a JSON object")])
def test_a_list_page_that_is_no_json_object_is_a_bad_response(
    serve: Callable[[Script], Kube], body: bytes, why: str
) -> None:
    with pytest.raises(KubeError) as err:
        serve(_reply(body)).send(LIST_PODS)
    assert (err.value.code, err.value.reason) == (0, "BadResponse")
    assert why in err.value.message


def test_a_watch_cut_mid_stream_yields_what_came_then_raises(serve: Callable[[Script], Kube]) -> None:
    def cut(conn: socket.socket) -> None:
        conn.sendall(chunked_head() + chunk(event("a", "5")) + b'40\r\n{"type": "ADD')
        conn.close()

    got: list[str] = []
    with pytest.raises(KubeError) as err:
        for ev in serve(cut).watch("/api/v1/pods", {}, timeout_s=5):
            got.append(ev["object"]["metadata"]["name"])
    assert got == ["a"]
    assert (err.value.code, err.value.reason) == (0, "Unreachable")


def test_a_watch_ending_inside_an_event_raises(serve: Callable[[Script], Kube]) -> None:
    def half_line(conn: socket.socket) -> None:
        conn.sendall(chunked_head() + chunk(event("a", "5")) + chunk(b'{"type": "ADD') + b"0\r\n\r\n")

    with pytest.raises(KubeError, match="stream ended inside an event"):
        list(serve(half_line).watch("/api/v1/pods", {}, timeout_s=5))


def test_a_malformed_watch_line_is_a_bad_response(serve: Callable[[Script], Kube]) -> None:
    def garbage(conn: socket.socket) -> None:
        conn.sendall(chunked_head() + chunk(b"not json\n") + b"0\r\n\r\n")

    with pytest.raises(KubeError) as err:
        list(serve(garbage).watch("/api/v1/pods", {}, timeout_s=5))
    assert (err.value.code, err.value.reason) == (0, "BadResponse")


def test_a_frozen_watch_is_detected_just_after_its_server_timeout(serve: Callable[[Script], Kube]) -> None:
    def frozen(conn: socket.socket) -> None:
        conn.sendall(chunked_head() + chunk(event("a", "5")))
        time.sleep(30)  # the server never closes the watch it promised to end after 1 s

    t0 = time.monotonic()
    got: list[JsonEvent] = []
    with pytest.raises(KubeError) as err:
        for ev in serve(frozen).watch("/api/v1/pods", {}, timeout_s=1):
            got.append(ev)
    took = time.monotonic() - t0
    assert len(got) == 1
    assert (err.value.code, err.value.reason) == (0, "Timeout")
    assert 1.4 <= took < 3.0  # timeoutSeconds 1 + margin 0.5


def test_a_clean_watch_end_and_an_error_event(serve: Callable[[Script], Kube]) -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "old"}}

    def stream(conn: socket.socket) -> None:
        body = event("a", "5") + b"\n" + event("b", "6") + json.dumps(gone).encode() + b"\n"
        conn.sendall(chunked_head() + chunk(body) + b"0\r\n\r\n")

    seen: list[str] = []
    with pytest.raises(KubeError) as err:
        for ev in serve(stream).watch("/api/v1/pods", {"resourceVersion": "4"}, timeout_s=5):
            seen.append(ev["object"]["metadata"]["name"])
    assert seen == ["a", "b"]  # the blank line between them is skipped
    assert err.value.is_gone


POOL = urllib3.HTTPConnectionPool("127.0.0.1", 1)


@pytest.mark.parametrize(
    ("exc", "reason", "text"),
    [
        (urllib3.exceptions.ReadTimeoutError(POOL, "/x", "Read timed out."), "Timeout", "ReadTimeoutError"),
        (
            urllib3.exceptions.MaxRetryError(
                POOL, "/x", urllib3.exceptions.NewConnectionError(None, "Connection refused")
            ),
            "Unreachable",
            "Connection refused",
        ),
        (
            urllib3.exceptions.MaxRetryError(POOL, "/x", urllib3.exceptions.ConnectTimeoutError("slow")),
            "Timeout",
            "ConnectTimeoutError: slow",
        ),
        (urllib3.exceptions.ProtocolError("Connection broken"), "Unreachable", "ProtocolError"),
        (ssl.SSLError(1, "UNEXPECTED_EOF_WHILE_READING"), "Unreachable", "SSLError"),
        (http.client.IncompleteRead(b"{", 10), "Unreachable", "IncompleteRead"),
        (TimeoutError("timed out"), "Timeout", "timed out"),
        (ConnectionResetError(104, "Connection reset by peer"), "Unreachable", "ConnectionResetError"),
    ],
    ids=[
        "read-timeout",
        "refused",
        "connect-timeout",
        "protocol",
        "ssl",
        "incomplete",
        "socket-timeout",
        "reset",
    ],
)
def test_transport_errors_map_to_one_kube_error(exc: BaseException, reason: str, text: str) -> None:
    err = transport_error(exc)
    assert (err.code, err.reason) == (0, reason)
    assert text in err.message


def _concurrent_gets(kubeconfig: Path, calls: int, connections: int) -> None:
    """`calls` GETs at once through one client (the server answers none until all arrived)."""
    arrived = threading.Barrier(calls, timeout=10)

    def answer_together(conn: socket.socket) -> None:
        arrived.wait()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        time.sleep(1)  # keep the connection open: the client may reuse it

    srv = Server(answer_together)
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{srv.port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    kube = Kube.connect(str(kubeconfig), connections=connections)
    try:
        threads = [threading.Thread(target=kube.send, args=(GET,)) for _ in range(calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
    finally:
        kube.close()
        srv.close()


def test_a_client_sized_for_its_concurrency_keeps_every_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The extender binds up to REQUEST_THREADS pods at once: a pool that small drops a connection per call
    with urllib3's "Connection pool is full" warning; sized from the same number, it keeps them all."""
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        _concurrent_gets(tmp_path / "small", calls=12, connections=4)
    assert any("Connection pool is full" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        _concurrent_gets(tmp_path / "sized", calls=12, connections=12)
    assert not [r.getMessage() for r in caplog.records if "Connection pool is full" in r.getMessage()]
