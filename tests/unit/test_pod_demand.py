"""`pod_demand` is worked out once per distinct ask: every pod still gets the demand it would get alone."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core import names, podview, request
from app.core.model import Demand

# Pods drawn from a few variants of each input of the demand (the request annotations, container names and
# kinds, the gpupack and whole-GPU resources, the CPU and memory requests), so that pods of one batch often
# differ in one input only.
annotations = st.sampled_from(
    [
        {},
        {names.GPU_FRACTION: "0.5"},
        {names.GPU_FRACTION: "0.5", names.ALLOC_NODE: "n1"},
        {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_CONTAINER_NAME: "side"},
        {names.GPU_MEMORY: "4Gi", names.GPU_FRACTION_NUM_DEVICES: "2"},
        {names.GPU_FRACTION: "0.25", names.GPU_MODEL: "A100-40GB", names.ISOLATION: "none"},
    ]
)
resources = st.sampled_from(
    [
        {},
        {"requests": {"cpu": "1"}},
        {"requests": {"cpu": "250m", "memory": "2Gi"}},
        {"requests": {names.RESOURCE_GPU_MILLI: "500"}},
        {"requests": {names.RESOURCE_GPU_MILLI: "500"}, "limits": {"nvidia.com/gpu": "1"}},
        {"limits": {"nvidia.com/gpu": "0", names.RESOURCE_GPU_MEMORY_MIB: "4096"}},
    ]
)
container = st.fixed_dictionaries({"name": st.sampled_from(["main", "side"]), "resources": resources})
pods = st.builds(
    lambda ann, regular, init, uid: {
        "metadata": {"uid": uid, "annotations": ann},
        "spec": {"containers": regular, "initContainers": init},
    },
    annotations,
    st.lists(container, max_size=2),
    st.lists(container, max_size=1),
    st.text(max_size=3),
)


def _forget() -> None:
    """Nothing worked out before: the next pod's own answer."""
    request._demand.cache_clear()
    request._verdict.cache_clear()


def _alone(pod: dict[str, Any]) -> request.PodDemand:
    _forget()
    return request.pod_demand(podview.read(pod))


@settings(max_examples=500, deadline=None)
@given(batch=st.lists(pods, min_size=2, max_size=5))
def test_each_pod_gets_the_demand_it_gets_alone(batch: list[dict[str, Any]]) -> None:
    _forget()
    together = [request.pod_demand(podview.read(p)) for p in batch]  # later pods may reuse earlier answers
    assert together == [_alone(p) for p in batch]


def _pod(ann: dict[str, str], regular: list[Any], init: list[Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"uid": "u", "annotations": ann},
        "spec": {"containers": regular, "initContainers": init or []},
    }


FRACTION = {names.GPU_FRACTION: "0.5"}
MAIN = {"name": "main"}
MILLI = {"requests": {names.RESOURCE_GPU_MILLI: "500"}}


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(_pod(FRACTION, [MAIN]), _pod({names.GPU_FRACTION: "0.25"}, [MAIN]), id="annotations"),
        pytest.param(_pod({}, [MAIN]), _pod({}, [{**MAIN, "resources": MILLI}]), id="gpupack-resources"),
        pytest.param(
            _pod(FRACTION, [MAIN]),
            _pod(FRACTION, [{**MAIN, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
            id="whole-gpus",
        ),
        pytest.param(
            _pod({**FRACTION, names.GPU_FRACTION_CONTAINER_NAME: "side"}, [MAIN]),
            _pod({**FRACTION, names.GPU_FRACTION_CONTAINER_NAME: "side"}, [{"name": "side"}]),
            id="container-name",
        ),
        pytest.param(_pod(FRACTION, [MAIN]), _pod(FRACTION, [], [MAIN]), id="container-kind"),
        pytest.param(
            _pod(FRACTION, [{**MAIN, "resources": {"requests": {"cpu": "1"}}}]),
            _pod(FRACTION, [{**MAIN, "resources": {"requests": {"cpu": "2"}}}]),
            id="host-request",
        ),
    ],
)
def test_pods_that_differ_in_one_input_of_the_demand_get_their_own(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    want = [_alone(first), _alone(second)]
    assert want[0] != want[1]
    _forget()
    assert [request.pod_demand(podview.read(p)) for p in (first, second)] == want


def test_pods_of_one_workload_ask_alike() -> None:
    def pod(uid: str, node: str) -> dict[str, Any]:
        res = {"requests": {"cpu": "1", names.RESOURCE_GPU_MILLI: "500"}}
        return {
            "metadata": {"uid": uid, "annotations": {**FRACTION, names.ALLOC_NODE: node}},
            "spec": {"containers": [{"name": "main", "resources": res}]},
        }

    a, b = (request.pod_demand(podview.read(p)) for p in (pod("a", "n1"), pod("b", "n2")))
    assert a == b == Demand(count=1, milli=500, cpu_milli=1000)
