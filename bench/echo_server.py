"""The reference row of bench/webhook.py: a bare uvicorn + TLS server that answers every request with one
fixed AdmissionReview, served exactly as `gpupack webhook serve --workers 1` serves /mutate (the same
reloading TLS context, uvloop + httptools, keep-alive, no access log). What the webhook costs above it is
the webhook's own per-review Python.

    .venv/bin/python bench/echo_server.py --cert tls.crt --key tls.key --port 8443
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import uvicorn  # noqa: E402
from starlette.types import Receive, Scope, Send  # noqa: E402

from app.service.tls import ReloadingContext  # noqa: E402
from webhook.command import KEEP_ALIVE_S  # noqa: E402

ANSWER = json.dumps(
    {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "echo", "allowed": True},
    },
    separators=(",", ":"),
).encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Read the whole body, as the webhook does, then send the fixed answer."""
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    tls = ReloadingContext(args.cert, args.key)
    config = uvicorn.Config(
        echo,
        host=args.host,
        port=args.port,
        ssl_context_factory=lambda _config, _default: tls.context,
        access_log=False,
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_S,
        loop="uvloop",
        http="httptools",
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
