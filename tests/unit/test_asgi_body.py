"""A bare endpoint's request body, however the server hands it over (one message, or a body in chunks)."""

from __future__ import annotations

import asyncio
from typing import Any

from app.service.asgi import request_body


def receiving(*messages: dict[str, Any]) -> Any:
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    return receive


def test_a_body_in_one_message_is_read_whole() -> None:
    got = asyncio.run(request_body(receiving({"type": "http.request", "body": b'{"a": 1}'})))
    assert got == b'{"a": 1}'


def test_a_body_in_chunks_is_joined_in_order() -> None:
    chunks = receiving(
        {"type": "http.request", "body": b'{"Pod"', "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b": {}}", "more_body": False},
    )
    assert asyncio.run(request_body(chunks)) == b'{"Pod": {}}'


def test_an_empty_request_reads_as_an_empty_body() -> None:
    assert asyncio.run(request_body(receiving({"type": "http.request"}))) == b""
