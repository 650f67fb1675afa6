"""`read_list` reads a list page into its items' shape: every pod reads as the whole pod does, and every body
reads (or fails) as `read_json` reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core import names, podview
from app.core.objects import ListPage, read_json, read_list, shaped
from app.core.pods import SlimPod, is_gpupack, pod_info

# Anything a hand-made or hostile object may hold where the API would put an object, a list or a string.
junk = (
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3) | st.lists(st.integers(), max_size=2)
)
quantities = st.sampled_from(["1", "500m", "2Gi", "1.5", "0", "-1", "1e3", "1k", "x"]) | junk
resources = st.fixed_dictionaries(
    {},
    optional={
        key: st.dictionaries(
            st.sampled_from(["cpu", "memory", names.RESOURCE_GPU_MILLI, "nvidia.com/gpu"]), quantities
        )
        | junk
        for key in ("requests", "limits")
    },
)
containers = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "name": st.sampled_from(["main", "log"]) | junk,
            "resources": resources | junk,
            "restartPolicy": st.just("Always") | junk,
            "image": st.text(max_size=4),
            "env": st.lists(st.fixed_dictionaries({"name": st.text(max_size=2)}), max_size=2),
        },
    )
    | junk,
    max_size=3,
)
annotations = st.dictionaries(
    st.sampled_from(
        [names.GPU_FRACTION, names.GPU_MEMORY, names.GPU_FRACTION_CONTAINER_NAME, names.ALLOC_NODE, "note"]
    ),
    st.sampled_from(["0.5", "4Gi", "main", "n1", "2"]) | junk,
)
pods = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {"uid": st.sampled_from(["u1", "u2"])},
            optional={
                "name": st.text(max_size=3) | junk,
                "namespace": st.just("ns") | junk,
                "labels": st.dictionaries(st.just(names.LABEL_MANAGED), st.just("true") | junk) | junk,
                "annotations": annotations | junk,
                "managedFields": st.lists(
                    st.fixed_dictionaries({"manager": st.text(max_size=3)}), max_size=2
                ),
                "deletionTimestamp": st.just("2026-01-01T00:00:00Z") | junk,
            },
        )
        | junk,
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "nodeName": st.just("n1") | junk,
                "containers": containers | junk,
                "initContainers": containers | junk,
                "overhead": st.dictionaries(st.just("cpu"), quantities) | junk,
                "volumes": st.lists(st.fixed_dictionaries({"name": st.text(max_size=2)}), max_size=2),
            },
        )
        | junk,
        "status": st.fixed_dictionaries(
            {},
            optional={
                "phase": st.sampled_from(["Running", "Succeeded"]) | junk,
                "containerStatuses": st.lists(
                    st.fixed_dictionaries({"name": st.just("main"), "containerID": st.just("containerd://a")})
                    | junk,
                    max_size=2,
                )
                | junk,
                "conditions": st.lists(st.fixed_dictionaries({"type": st.just("Ready")}), max_size=2),
            },
        )
        | junk,
    },
)


def _page(items: list[Any]) -> bytes:
    return json.dumps({"kind": "PodList", "metadata": {"continue": "7"}, "items": items}).encode()


def _reading(pod: Any) -> Any:
    """What gpupack makes of a pod (or the error it raises on it)."""
    try:
        view = podview.read(pod)
        return pod_info(pod), view.host, is_gpupack(view)
    except Exception as exc:  # the same failure on both sides is the same reading
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(pod=pods)
def test_a_listed_pod_reads_as_the_whole_pod_reads(pod: dict[str, Any]) -> None:
    page = read_list(_page([pod]), SlimPod)
    assert page["metadata"] == {"continue": "7"}
    [listed] = page["items"]
    assert _reading(listed) == _reading(pod)
    assert "managedFields" not in json.dumps(listed) and "conditions" not in json.dumps(listed)


@settings(max_examples=100, deadline=None)
@given(pod=pods)
def test_a_watched_pod_is_cut_to_the_shape_a_listed_one_is_read_into(pod: dict[str, Any]) -> None:
    assert shaped(pod, SlimPod) == read_list(_page([pod]), SlimPod)["items"][0]


def test_the_shape_keeps_what_the_readers_read_and_drops_the_rest() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "uid": "u",
            "labels": {"a": "b"},
            "managedFields": [{}],
            "generateName": "p-",
        },
        "spec": {
            "nodeName": "n1",
            "schedulerName": "x",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}, "image": "i", "env": []}],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "c", "containerID": "d://1", "ready": 1}],
        },
    }
    assert read_list(_page([pod]), SlimPod)["items"] == [
        {
            "metadata": {"name": "p", "uid": "u", "labels": {"a": "b"}},
            "spec": {
                "nodeName": "n1",
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
            },
            "status": {"phase": "Running", "containerStatuses": [{"name": "c", "containerID": "d://1"}]},
        }
    ]


ONLY_JSON_READS = [
    pytest.param('{"items": [{"metadata": {"name": "é"}}]}'.encode("utf-16"), id="utf-16"),
    pytest.param('{"items": [{"metadata": {"name": "a"}}]}'.encode("utf-8-sig"), id="utf-8-bom"),
    pytest.param(b'{"items": [{"metadata": {"name": "\\ud800"}}]}', id="lone-surrogate"),
    pytest.param(b'{"items": [{"metadata": {"name": 1e400}, "spec": NaN}]}', id="non-finite"),
    pytest.param(
        b'{"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": 1e400}}', id="page-meta"
    ),
]


@pytest.mark.parametrize("raw", ONLY_JSON_READS)
def test_bodies_only_json_reads_are_read_and_then_shaped(raw: bytes) -> None:
    want = shaped(json.loads(raw), ListPage[SlimPod])  # type: ignore[misc]
    assert repr(read_list(raw, SlimPod)) == repr(want)  # repr: NaN is unequal to itself


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"items"', b"null"], ids=["array", "string", "null"])
def test_a_page_that_is_no_object_reads_as_json(raw: bytes) -> None:
    assert read_list(raw, SlimPod) == json.loads(raw)


@pytest.mark.parametrize("raw", [b'{"items": [', b'{"items": [1,]}', b'{"items": []}x'])
def test_malformed_pages_fail_as_read_json_fails(raw: bytes) -> None:
    with pytest.raises(json.JSONDecodeError) as want:
        read_json(raw)
    with pytest.raises(json.JSONDecodeError) as got:
        read_list(raw, SlimPod)
    assert (got.value.msg, got.value.pos) == (want.value.msg, want.value.pos)
