"""`gpupack webhook serve --workers N` as real HTTPS processes: every worker answers, /metrics is the sum
over the workers, a rotated certificate reaches each worker, and the parent stops all or none of them."""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from httpsprobe import wait_until_healthy
from prometheus_client.parser import text_string_to_metric_families

from app.core import names
from app.service import certs
from tests.devcluster import wait_for
from tests.devcluster.ports import free_ports
from webhook.schemas import AdmissionRequest, AdmissionReview, GroupVersionKind, GroupVersionResource

REPO = Path(__file__).resolve().parents[2]
WORKERS = 2


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    dir: Path

    def connect(self) -> http.client.HTTPSConnection:
        ctx = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx, timeout=10)

    def workers(self) -> list[int]:
        pid = self.proc.pid
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    def metrics(self) -> dict[tuple[str, str], float]:
        """(sample name, outcome/result label) -> value, from /metrics on a new connection."""
        conn = self.connect()
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[s.name, s.labels.get("outcome", s.labels.get("result", ""))] = s.value
        return out


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    certs.write_bundle(tmp_path, ["localhost"], ["127.0.0.1"])
    port = free_ports(1)[0]
    argv = [sys.executable, "-m", "app.cli", "webhook", "serve", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--cert", str(tmp_path / "tls.crt"), "--key", str(tmp_path / "tls.key")]
    argv += ["--workers", str(WORKERS), "--cert-check-interval", "0.2"]
    log = (tmp_path / "webhook.log").open("wb")
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=log, stderr=log, env={**os.environ, "TMPDIR": str(tmp_path)}
    )
    srv = Server(proc, port, tmp_path)

    try:
        wait_until_healthy(srv.connect, "the webhook")
        wait_for(lambda: len(srv.workers()) == WORKERS, 10, f"{WORKERS} worker processes")
        _every_worker_serving(srv)  # each has loaded its certificate: a rotation from now on is a reload
        yield srv
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(15)
        log.close()


def review(uid: str) -> bytes:
    """A pod CREATE review asking for half a GPU, built with the webhook's own wire models."""
    pod = {
        "metadata": {"name": "p", "annotations": {names.GPU_FRACTION: "0.5"}},
        "spec": {"containers": [{"name": "main", "image": "cuda"}]},
    }
    request = AdmissionRequest(
        uid=uid,
        kind=GroupVersionKind(version="v1", kind="Pod"),
        resource=GroupVersionResource(version="v1", resource="pods"),
        operation="CREATE",
        namespace="team-a",
        object=pod,
    )
    body = AdmissionReview(api_version="admission.k8s.io/v1", kind="AdmissionReview", request=request)
    return body.model_dump_json(by_alias=True, exclude_none=True).encode()


def test_every_worker_answers_and_metrics_are_the_sum(server: Server) -> None:
    # New connections go to whichever worker accepts first: open them until every worker holds one.
    workers = server.workers()
    before = {w: _sockets(w) for w in workers}
    connections: list[http.client.HTTPSConnection] = []

    def every_worker_holds_one() -> bool:
        conn = server.connect()
        conn.connect()  # TCP + TLS handshake: accepted by one worker
        connections.append(conn)
        return all(_sockets(w) > before[w] for w in workers)

    wait_for(every_worker_holds_one, 20, "a kept connection on every worker", interval=0)
    sent = 0
    for round_ in range(5):
        for i, conn in enumerate(connections):
            uid = f"uid-{round_}-{i}"
            conn.request("POST", "/mutate", body=review(uid), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            answer = json.loads(resp.read())["response"]
            assert (resp.status, answer["uid"], answer["allowed"], answer["patchType"]) == (
                200, uid, True, "JSONPatch",
            )  # fmt: skip
            sent += 1
    # Whichever worker answers the scrape, it reports every worker's reviews, not its own share.
    for _ in range(6):
        got = server.metrics()
        assert got["gpupack_webhook_reviews_total", "mutated"] == sent
        assert got["gpupack_webhook_review_duration_seconds_count", ""] == sent
        assert got["gpupack_webhook_reviews_total", "error"] == 0  # every series exists, at zero too


def _every_worker_serving(server: Server) -> None:
    """A TLS handshake accepted by every worker (a worker still starting would read a rotated certificate
    as its first, not reload it)."""
    workers = server.workers()
    before = {w: _sockets(w) for w in workers}
    held: list[http.client.HTTPSConnection] = []

    def served_by_all() -> bool:
        conn = server.connect()
        conn.connect()
        held.append(conn)
        return all(_sockets(w) > before[w] for w in workers)

    wait_for(served_by_all, 30, "a TLS handshake on every worker", interval=0)
    for conn in held:
        conn.close()


def _sockets(pid: int) -> int:
    """How many sockets the process has open (its listening socket, plus one per accepted connection)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except FileNotFoundError:  # closed while we looked
            continue
    return count


def test_rotated_certificate_reaches_every_worker(server: Server) -> None:
    first = _served_serial(server)
    certs.write_bundle(server.dir, ["localhost"], ["127.0.0.1"])  # same CA, new serving certificate
    new = x509.load_pem_x509_certificate((server.dir / "tls.crt").read_bytes()).serial_number
    assert new != first

    def everyone_reloaded() -> bool:
        # Each worker reloads on its next new connection: connect until every worker has counted one.
        serials = {_served_serial(server) for _ in range(4)}
        return serials == {new} and server.metrics()["gpupack_webhook_cert_reloads_total", "ok"] == WORKERS

    wait_for(everyone_reloaded, 20, "the rotated certificate served by every worker")
    assert server.proc.poll() is None


def _served_serial(server: Server) -> int:
    pem = ssl.get_server_certificate(("127.0.0.1", server.port), timeout=5)
    return x509.load_pem_x509_certificate(pem.encode()).serial_number


def test_sigterm_stops_every_worker_and_removes_the_metrics_dir(server: Server) -> None:
    workers = server.workers()
    [metrics_dir] = server.dir.glob("gpupack-webhook-metrics-*")
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(20) == 0
    assert not any(Path(f"/proc/{w}").exists() for w in workers)
    assert not metrics_dir.exists()


def test_a_dead_worker_stops_the_server_non_zero(server: Server) -> None:
    dead, *others = server.workers()
    os.kill(dead, signal.SIGKILL)
    assert server.proc.wait(20) == 1  # the kubelet restarts the container, at full capacity
    wait_for(lambda: not any(Path(f"/proc/{w}").exists() for w in others), 10, "the other workers gone")
