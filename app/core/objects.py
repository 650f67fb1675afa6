"""JSON off the wire: decoded (`read_json`, or `read_list` and `shaped` into a shape that keeps only what a
reader needs), then read type-tolerantly (a pod dict may hold anything where a map is expected)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypedDict, TypeVar

import msgspec
from pydantic_core import from_json

# What a shape's field takes where it expects a JSON object (or array) and the document holds anything
# else: the value is kept as it came, so a shape reads every JSON document without error and the readers
# after it see what `read_json` would have given them (they read wrong types as empty).
NotAnObject = list[Any] | str | int | float | bool | None
NotAnArray = dict[str, Any] | str | int | float | bool | None

Item = TypeVar("Item")


class ListPage(TypedDict, Generic[Item], total=False):
    """One page of a list call: the API's `metadata` (resourceVersion, continue) and its `items`."""

    metadata: Any
    items: list[Item | NotAnObject] | NotAnArray


def read_json(raw: bytes | str) -> Any:
    """The JSON value of `raw`, exactly as `json.loads` reads it, in less CPU.

    pydantic's Rust JSON reader goes first: about half the CPU of `json.loads` on an extender request's
    5 000 node names, a fifth less on the API's list pages. Only object keys are interned: node names,
    uids and the like are all distinct, and a cache of them costs more than it saves. It refuses a few
    bodies that `json.loads` accepts (UTF-16/32, a byte-order mark, lone surrogates) and every malformed
    one: those go to `json.loads`, so they are read, or refused with json's error and position, as before.
    """
    try:
        return from_json(raw, cache_strings="keys")
    except ValueError:
        return json.loads(raw)


def read_list(raw: bytes | str, item_shape: type[Any]) -> Any:
    """A list page with each item read into `item_shape` (a TypedDict whose fields are the item's fields
    a reader needs), as `shaped(read_json(raw), ListPage[item_shape])` reads it, in a fraction of the CPU.

    msgspec reads the page straight into the shape, skipping every other field without building it
    (a listed pod's managedFields, env, volumes and conditions are four fifths of its bytes). A body it
    refuses (the few `read_json` leaves to `json.loads`, a number out of range, a page that is not a JSON
    object) is read by `read_json` and then shaped: the same value, or `json.loads`' error.
    """
    try:
        return _page_decoder(item_shape).decode(raw)
    except msgspec.MsgspecError:
        value = read_json(raw)
        return shaped(value, ListPage[item_shape]) if type(value) is dict else value  # type: ignore[valid-type]


def shaped(value: dict[str, Any], shape: type[Any]) -> Any:
    """A decoded JSON object read into `shape` (a TypedDict): only the fields it names are kept, each as it
    came (a nested shape keeps only its own fields of a nested object)."""
    return msgspec.convert(value, shape)


_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}  # by item shape: a decoder compiles its type once


def _page_decoder(item_shape: type[Any]) -> msgspec.json.Decoder[Any]:
    decoder = _DECODERS.get(item_shape)
    if decoder is None:
        decoder = _DECODERS[item_shape] = msgspec.json.Decoder(ListPage[item_shape])  # type: ignore[valid-type]
    return decoder


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
