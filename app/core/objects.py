"""Type-tolerant reads of JSON objects off the wire: a pod dict may hold anything where a map is expected."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def as_object(value: object) -> Mapping[str, Any]:
    """`value` when it is a JSON object, else an empty one."""
    if type(value) is dict:  # what JSON decoding gives: skips the slower Mapping (ABC) check
        return value
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> Sequence[Any]:
    """`value` when it is a JSON array, else an empty one."""
    return value if isinstance(value, list | tuple) else ()


def string_map(value: object) -> dict[str, str]:
    """The string-to-string entries of a JSON object (annotations, labels); anything else is dropped."""
    return {k: v for k, v in as_object(value).items() if isinstance(k, str) and isinstance(v, str)}
