"""Fault tools: the share audit, proxied kubeconfigs, ready-endpoint routing, and the breakable TCP proxy."""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core import names
from tests.devcluster import ComponentSpec, processes, wait_for
from tests.devcluster.faults import ExtenderRig, ReadyPicker, TcpProxy, audit, fixed, kubeconfig_via


def pod(
    name: str, node: str = "", alloc_node: str = "", gpus: str = "0", milli: int = 500, **extra: Any
) -> dict[str, Any]:
    ann = {}
    if alloc_node:
        ann = {
            names.ALLOC_NODE: alloc_node,
            names.ALLOC_GPU_INDEXES: gpus,
            names.ALLOC_GPU_MILLI: str(milli),
            names.ALLOC_MEMORY_LIMIT_MIB: "1000",
        }
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "labels": {names.LABEL_MANAGED: "true"},
            "annotations": ann,
        },
        "spec": {"nodeName": node} if node else {},
        "status": extra.get("status", {"phase": "Pending" if not node else "Running"}),
    }


def test_audit_of_a_clean_cluster_is_ok() -> None:
    got = audit([pod("a", "n1", "n1", "0", 500), pod("b", "n1", "n1", "0", 500), pod("c")])
    assert got.ok
    assert (got.pods, got.bound, got.pending) == (3, 2, 1)
    assert got.overcommitted == {}


def test_audit_counts_a_gpu_handed_out_twice_across_devices() -> None:
    got = audit(
        [pod("a", "n1", "n1", "0,1", 600), pod("b", "n1", "n1", "1", 500), pod("c", "n2", "n2", "1", 600)]
    )
    assert not got.ok
    assert got.overcommitted == {"n1/1": 1100}


def test_audit_counts_the_share_of_an_allocated_but_unbound_pod() -> None:
    got = audit([pod("a", "n1", "n1", "0", 700), pod("b", "", "n1", "0", 400)])
    assert got.overcommitted == {"n1/0": 1100}
    assert got.stranded == ("ns/b",)


def test_audit_names_bound_pods_without_or_with_a_wrong_allocation() -> None:
    bad = pod("corrupt", "n1", "n1", "x", 100)
    got = audit([pod("bare", "n1"), pod("moved", "n2", "n1"), bad])
    assert got.unallocated == ("ns/bare",)
    assert got.misplaced == ("ns/moved: allocation on n1, bound to n2",)
    assert len(got.corrupt) == 1 and got.corrupt[0].startswith("ns/corrupt: ")
    assert names.ALLOC_GPU_INDEXES in got.corrupt[0]


def test_audit_ignores_finished_and_unmanaged_pods() -> None:
    done = pod("done", "n1", "n1", "0", 900, status={"phase": "Succeeded"})
    foreign = pod("foreign", "n1", "n1", "0", 900)
    foreign["metadata"]["labels"] = {}
    got = audit([done, foreign, pod("live", "n1", "n1", "0", 900)])
    assert got.ok and got.pods == 1


def test_kubeconfig_via_rewrites_every_server_and_keeps_the_rest() -> None:
    doc = {
        "clusters": [
            {"name": "c", "cluster": {"server": "https://127.0.0.1:1", "certificate-authority": "/ca"}}
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }
    out = kubeconfig_via(doc, "https://127.0.0.1:2")
    assert out["clusters"][0]["cluster"] == {"server": "https://127.0.0.1:2", "certificate-authority": "/ca"}
    assert out["users"] == doc["users"]
    assert doc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:1"  # the input is not changed
    with pytest.raises(ValueError, match=r"kubeconfig clusters=\[\]: must be a non-empty list"):
        kubeconfig_via({"clusters": []}, "x")


def test_ready_picker_routes_to_the_first_ready_upstream_and_caches_probes() -> None:
    now = [0.0]
    ready = {"a": True, "b": True}
    calls: list[str] = []

    def probe(name: str) -> bool:
        calls.append(name)
        if name == "boom":
            raise OSError("probe failed")
        return ready[name]

    pick = ReadyPicker(
        [(("h", 1), lambda: probe("a")), (("h", 2), lambda: probe("b"))], cache_s=1.0, clock=lambda: now[0]
    )
    assert pick() == ("h", 1)
    ready["a"] = False
    assert pick() == ("h", 1)  # cached
    now[0] = 1.0
    assert pick() == ("h", 2)
    ready["b"] = False
    now[0] = 2.0
    assert pick() is None
    assert calls == ["a", "a", "b", "a", "b"]
    raising = ReadyPicker([(("h", 3), lambda: probe("boom"))], clock=lambda: now[0])
    assert raising() is None
    with pytest.raises(ValueError, match="upstreams=\\[\\]"):
        ReadyPicker([])


# ---- the proxy, against a loopback echo server ----


@pytest.fixture
def echo() -> Iterator[int]:
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.1)
    stop = threading.Event()

    def serve_one(conn: socket.socket) -> None:
        with conn, contextlib.suppress(ConnectionResetError):  # the proxy's sever resets this side too
            while data := conn.recv(4096):
                conn.sendall(data)

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    srv.close()


def roundtrip(sock: socket.socket, msg: bytes) -> bytes:
    sock.sendall(msg)
    got = b""
    while len(got) < len(msg):
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def connect(proxy: TcpProxy) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=3)
    return s


def turned_away(proxy: TcpProxy) -> bool:
    """A new connection fails: reset during the handshake, or accepted by the kernel and reset at once."""
    try:
        with connect(proxy) as s:
            return s.recv(1) == b""
    except OSError:
        return True


def test_proxy_forwards_both_ways_and_passes_a_half_close_on(echo: int) -> None:
    with TcpProxy(fixed("127.0.0.1", echo)) as proxy, connect(proxy) as s:
        assert roundtrip(s, b"hello" * 1000) == b"hello" * 1000
        s.shutdown(socket.SHUT_WR)
        assert s.recv(10) == b""  # the echo server saw our EOF and closed its side
        wait_for(lambda: proxy.connections == 0, 5, "pair gone after both halves closed")
        assert proxy.stats.accepted == 1


def test_sever_resets_open_connections_and_refuses_new_ones_for_a_while(echo: int) -> None:
    with TcpProxy(fixed("127.0.0.1", echo)) as proxy:
        s = connect(proxy)
        assert roundtrip(s, b"x") == b"x"
        assert proxy.sever(refuse_s=30) == 1
        with pytest.raises(OSError):  # reset by the proxy (or EOF turned into an error by sendall)
            for _ in range(50):
                if roundtrip(s, b"y") == b"":
                    raise ConnectionResetError("closed")
        s.close()
        assert turned_away(proxy)
        assert proxy.stats.refused >= 1 and proxy.stats.severed == 1


def test_sever_without_a_refusal_window_lets_clients_reconnect(echo: int) -> None:
    with TcpProxy(fixed("127.0.0.1", echo)) as proxy:
        with connect(proxy) as s:
            roundtrip(s, b"a")
        proxy.sever()
        with connect(proxy) as s2:
            assert roundtrip(s2, b"again") == b"again"


def test_freeze_holds_bytes_until_thaw_and_keeps_connections_open(echo: int) -> None:
    with TcpProxy(fixed("127.0.0.1", echo)) as proxy, connect(proxy) as s:
        assert roundtrip(s, b"1") == b"1"
        proxy.freeze()
        s.sendall(b"held")
        s.settimeout(0.5)
        with pytest.raises(TimeoutError):
            s.recv(10)
        late = connect(proxy)  # accepted while frozen, nothing forwarded
        late.sendall(b"late")
        late.settimeout(0.3)
        with pytest.raises(TimeoutError):
            late.recv(10)
        assert proxy.connections == 2
        proxy.thaw()
        s.settimeout(3)
        late.settimeout(3)
        assert s.recv(10) == b"held"
        assert late.recv(10) == b"late"
        late.close()


def test_no_upstream_means_every_connection_is_reset() -> None:
    with TcpProxy(lambda: None) as proxy:
        assert turned_away(proxy)
        wait_for(lambda: proxy.stats.refused == 1, 5, "refusal counted")


def test_managed_process_stop_and_cont_freeze_the_group(tmp_path: Path) -> None:
    code = "import time\nwhile True:\n    print('tick', flush=True); time.sleep(0.05)"
    proc = processes.start(ComponentSpec("ticker", (sys.executable, "-c", code)), tmp_path / "t.log")
    try:
        wait_for(lambda: "tick" in proc.tail(), 10, "first tick")
        proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: processes._stat_fields(proc.pid)[0] == "T", 5, "stopped state")  # type: ignore[index]
        proc.send_signal(signal.SIGCONT)
        wait_for(lambda: processes._stat_fields(proc.pid)[0] in "RS", 5, "running again")  # type: ignore[index]
        proc.kill()
        assert not proc.alive()
    finally:
        proc.stop(grace_s=1)


def test_sever_upstream_cuts_only_the_connections_to_that_upstream(echo: int) -> None:
    other = socket.create_server(("127.0.0.1", 0))  # accepts (kernel backlog), never answers
    targets = iter([("127.0.0.1", echo), other.getsockname()])
    with TcpProxy(lambda: next(targets)) as proxy, connect(proxy) as to_echo, connect(proxy) as to_other:
        assert roundtrip(to_echo, b"a") == b"a"
        wait_for(lambda: proxy.connections == 2, 5, "both connections proxied")
        assert proxy.sever_upstream(other.getsockname()) == 1
        assert proxy.connections == 1
        assert roundtrip(to_echo, b"still") == b"still"
        to_other.settimeout(3)
        with pytest.raises(OSError):
            if to_other.recv(1) == b"":
                raise ConnectionResetError("closed")
    other.close()


def test_rig_needs_at_least_one_replica() -> None:
    with pytest.raises(ValueError, match="replicas=0: must be >= 1"):
        ExtenderRig(None, replicas=0)  # type: ignore[arg-type]
