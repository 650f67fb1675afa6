"""JSON pointers (RFC 6901) for JSON patches: the webhook's mutations and the extender's allocation patch."""

from __future__ import annotations

from functools import lru_cache


# The same few keys (gpupack's resources and annotations) are escaped on every review: remembered.
@lru_cache(maxsize=1024)
def pointer(*segments: str) -> str:
    """The pointer to `segments` ("/a/b"), each escaped: "~" as "~0", "/" as "~1" (so keys may hold "/")."""
    return "".join("/" + s.replace("~", "~0").replace("/", "~1") for s in segments)
