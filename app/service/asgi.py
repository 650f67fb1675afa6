"""What the services' bare ASGI endpoints share (the webhook's review, the extender's filter and prioritize):
they skip the web framework's request handling on their hot path, so they read the body themselves."""

from __future__ import annotations

from starlette.types import Receive


async def request_body(receive: Receive) -> bytes:
    """The whole request body: one message usually, all of its chunks when the client sent several."""
    message = await receive()
    raw: bytes = message.get("body", b"")
    if not message.get("more_body"):
        return raw  # the common case: no list, no join
    chunks = [raw]
    while message.get("more_body"):
        message = await receive()
        chunks.append(message.get("body", b""))
    return b"".join(chunks)
