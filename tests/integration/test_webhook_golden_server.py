"""`gpupack webhook serve` over HTTPS answers exactly as recorded: the status, content type and JSON body of
every golden review (tests/golden/webhook/*.input.json) and of the server-level cases in
tests/golden/webhook-server/requests.json (Pod Security paths, HAMi, other kinds, hostile values, malformed
bodies, wrong methods and paths, probes), under two flag sets: none, and the chart's with every option on.

The expected answers are tests/golden/webhook-server/<flags>.output.json (rewrite with --update-golden and
review the diff): whatever serves the webhook, the apiserver must get the same decisions."""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from httpsprobe import wait_until_healthy

from app.service import certs
from tests.devcluster.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
SERVER_CASES = GOLDEN / "webhook-server"

# The chart's flags with nodeSide enabled, scheduler.mode=second and webhook.hamiTakeover=true.
FLAG_SETS = {
    "default": (),
    "chart": ("--runtime-class=gpupack", "--scheduler-name=gpupack-scheduler", "--hami-takeover"),
}


def requests() -> list[dict[str, Any]]:
    """Every case: the mutate goldens POSTed to /mutate, then requests.json's own cases."""
    reviews = [
        {"name": f"review/{p.name.removesuffix('.input.json')}", "method": "POST", "path": "/mutate"}
        | {"json": json.loads(p.read_text())}
        for p in sorted((GOLDEN / "webhook").glob("*.input.json"))
    ]
    return reviews + json.loads((SERVER_CASES / "requests.json").read_text())


def body_of(case: dict[str, Any]) -> bytes | None:
    if "json" in case:
        return json.dumps(case["json"]).encode()
    if "text" in case:
        return str(case["text"]).encode()
    if "base64" in case:
        return base64.b64decode(case["base64"])
    return None


@pytest.fixture(params=sorted(FLAG_SETS))
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Callable[[], Any]]]:
    flags: str = request.param
    certs.write_bundle(tmp_path, ["localhost"], ["127.0.0.1"])
    port = free_ports(1)[0]
    argv = [sys.executable, "-m", "app.cli", "webhook", "serve", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--cert", str(tmp_path / "tls.crt"), "--key", str(tmp_path / "tls.key"), *FLAG_SETS[flags]]
    log = (tmp_path / "webhook.log").open("wb")
    proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=log, env=dict(os.environ))
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))

    def connect() -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)

    try:
        wait_until_healthy(connect, "the webhook")
        yield flags, connect
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


def test_answers_equal_the_golden_files(
    server: tuple[str, Callable[[], http.client.HTTPSConnection]], golden: Callable[[Path, Any], None]
) -> None:
    flags, connect = server
    conn = connect()  # one kept connection, as the apiserver keeps its own
    answers = {}
    try:
        for case in requests():
            body = body_of(case)
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(case["method"], case["path"], body=body, headers=headers)
            resp = conn.getresponse()
            answers[case["name"]] = {
                "status": resp.status,
                "content_type": resp.getheader("content-type"),
                "body": json.loads(resp.read()),
            }
    finally:
        conn.close()
    golden(SERVER_CASES / f"{flags}.output.json", answers)
