"""`read_json` reads every body as `json.loads` does: the same value, or the same error at the same place."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.objects import read_json

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_any_json_reads_as_json_loads_reads_it(value: Any) -> None:
    raw = json.dumps(value, ensure_ascii=False).encode()
    assert read_json(raw) == json.loads(raw)


ACCEPTED_BY_JSON_ONLY = [
    pytest.param('{"a": [1, "x"]}'.encode("utf-16"), id="utf-16"),
    pytest.param('{"a": [1, "x"]}'.encode("utf-32-be"), id="utf-32"),
    pytest.param('{"a": [1, "x"]}'.encode("utf-8-sig"), id="utf-8-bom"),
    pytest.param(b'{"a": "\\ud800"}', id="lone-surrogate"),
]


@pytest.mark.parametrize("raw", ACCEPTED_BY_JSON_ONLY)
def test_bodies_only_json_loads_accepts_read_the_same(raw: bytes) -> None:
    assert read_json(raw) == json.loads(raw)


def test_non_finite_numbers_read_as_json_loads_reads_them() -> None:
    got = read_json(b'{"a": NaN, "b": Infinity, "c": 1e400, "d": 123456789012345678901234567890}')
    assert math.isnan(got["a"]) and got["b"] == got["c"] == math.inf
    assert got["d"] == 123456789012345678901234567890


@pytest.mark.parametrize("raw", [b'{"Pod": ', b"[1,]", b'{"a": 01}', b'{"a": 1}x', b'{"a": "\n"}'])
def test_malformed_json_fails_as_json_loads_fails(raw: bytes) -> None:
    with pytest.raises(json.JSONDecodeError) as want:
        json.loads(raw)
    with pytest.raises(json.JSONDecodeError) as got:
        read_json(raw)
    assert (got.value.msg, got.value.pos) == (want.value.msg, want.value.pos)


def test_bytes_that_are_no_unicode_fail_as_json_loads_fails() -> None:
    with pytest.raises(UnicodeDecodeError):
        read_json(b'{"a": "\x80"}')
