"""webhook.protocol: a response's head and body leave in one write, and nothing is lost or reordered."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from webhook.protocol import JoinedWritesTransport

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"


class Recorder:
    """The real transport's side: what was written, in which calls, and whether it was closed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def joined(loop: asyncio.AbstractEventLoop) -> tuple[JoinedWritesTransport, Recorder]:
    real = Recorder()
    return JoinedWritesTransport(real, loop), real  # type: ignore[arg-type]


def step(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(asyncio.sleep(0))


def test_head_and_body_leave_in_one_write(loop: asyncio.AbstractEventLoop) -> None:
    transport, real = joined(loop)
    transport.write(HEAD)
    assert real.writes == []
    transport.write(b"{}")
    assert real.writes == [HEAD + b"{}"]
    step(loop)  # the pending flush finds nothing left to send
    assert real.writes == [HEAD + b"{}"]


def test_a_head_alone_is_sent_on_the_next_loop_step(loop: asyncio.AbstractEventLoop) -> None:
    transport, real = joined(loop)
    transport.write(HEAD)
    step(loop)
    assert real.writes == [HEAD]
    transport.write(b"chunk")
    assert real.writes == [HEAD, b"chunk"]


def test_other_writes_go_straight_through_in_order(loop: asyncio.AbstractEventLoop) -> None:
    transport, real = joined(loop)
    transport.write(b"not a head")
    transport.write(HEAD)
    transport.write(b"{}")
    transport.write(b"more")
    assert real.writes == [b"not a head", HEAD + b"{}", b"more"]


def test_close_sends_a_held_head_first(loop: asyncio.AbstractEventLoop) -> None:
    transport, real = joined(loop)
    transport.write(HEAD)
    transport.close()
    assert (real.writes, real.closed) == ([HEAD], True)
    step(loop)
    assert real.writes == [HEAD]


def test_a_head_held_when_the_peer_went_away_is_dropped(loop: asyncio.AbstractEventLoop) -> None:
    transport, real = joined(loop)
    transport.write(HEAD)
    real.closed = True
    step(loop)
    assert real.writes == []


def test_everything_else_is_the_real_transports(loop: asyncio.AbstractEventLoop) -> None:
    transport, _ = joined(loop)
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)
    assert transport.is_closing() is False
