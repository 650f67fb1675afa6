"""JSON pointers (RFC 6901): the one escaper behind every JSON patch gpupack sends."""

from __future__ import annotations

import pytest

from app.core.jsonpointer import pointer


@pytest.mark.parametrize(
    ("segments", "expected"),
    [
        (("metadata", "annotations", "gpupack.io/node"), "/metadata/annotations/gpupack.io~1node"),
        (("a~b", "c/d~1"), "/a~0b/c~1d~01"),
        (("spec", "containers", "0"), "/spec/containers/0"),
        (("",), "/"),
        ((), ""),
    ],
    ids=["slash-in-key", "tilde-before-slash", "plain", "empty-key", "whole-document"],
)
def test_pointer_escapes_each_segment(segments: tuple[str, ...], expected: str) -> None:
    assert pointer(*segments) == expected
