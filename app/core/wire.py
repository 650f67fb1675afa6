"""Malformed request bodies as a 4xx answer that names each bad field (shared by the webhook and extender).

FastAPI reports a body that does not fit its schema as a list of pydantic errors. This turns them into
`{"message": "<field.path>: <rule>; ...", "detail": [{"loc", "msg", "type"}, ...]}`. The input value is
left out: it can be a whole pod, which is neither the client's news nor the log's business.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MAX_PROBLEMS = 10  # a fuzzed body can fail a hundred ways; the first few say enough


def problems(errors: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """pydantic/FastAPI error dicts reduced to loc, msg and type, at most MAX_PROBLEMS of them."""
    out: list[dict[str, Any]] = []
    for err in errors:
        loc = [x if isinstance(x, int | str) else str(x) for x in err.get("loc", ())]
        kind, msg = str(err.get("type", "")), str(err.get("msg", ""))
        if kind == "json_invalid":  # FastAPI puts the character offset where a field name would be
            msg = f"{msg} at character {loc[1]}" if len(loc) > 1 else msg
            loc = ["body"]
        out.append({"loc": loc or ["body"], "msg": msg, "type": kind})
        if len(out) == MAX_PROBLEMS:
            break
    return out


def field_path(loc: Sequence[Any]) -> str:
    """`["body", "Pod", "spec", "containers", 0]` -> `Pod.spec.containers.0`; the body itself is `body`."""
    parts = [str(x) for x in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "body"


def message(found: Sequence[Mapping[str, Any]]) -> str:
    """One line: each field path with its rule, in the order pydantic found them."""
    return "; ".join(f"{field_path(p['loc'])}: {p['msg']}" for p in found)


def unreadable(reason: str) -> dict[str, Any]:
    """The JSON answer for a body that could not even be parsed (FastAPI's 400)."""
    return body([{"loc": ["body"], "msg": reason, "type": "body_unreadable"}])


def body(errors: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON answer for a malformed body."""
    found = problems(errors)
    return {"message": message(found), "detail": found}
