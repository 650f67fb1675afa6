"""Extender wire format: what kube-scheduler sends parses, and what we answer uses Go field names."""

from __future__ import annotations

import json

from extender.schemas import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriority,
    HostPriorityList,
)

# As encoding/json writes ExtenderArgs with nodeCacheCapable: true (nil pointers as null).
SCHEDULER_FILTER = (
    '{"Pod":{"metadata":{"name":"p1","namespace":"default","uid":"6f0c"},"spec":{},"status":{}},'
    '"Nodes":null,"NodeNames":["gpu-node-0","gpu-node-1"]}'
)


def test_filter_args_from_scheduler() -> None:
    args = ExtenderArgs.model_validate_json(SCHEDULER_FILTER)
    assert args.Nodes is None and args.node_names() == ["gpu-node-0", "gpu-node-1"]
    assert args.pod()["metadata"]["uid"] == "6f0c"


def test_filter_args_with_full_nodes_and_unknown_fields() -> None:
    raw = {"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "a"}}]}, "NodeNames": None, "Future": 1}
    assert ExtenderArgs.model_validate(raw).node_names() == ["a"]
    assert ExtenderArgs.model_validate({"Pod": {}}).node_names() == []


def test_filter_result_keys_are_go_field_names() -> None:
    out = ExtenderFilterResult(NodeNames=["a"], FailedNodes={"b": "no GPU with 0.50 free: best has 0.25"})
    assert json.loads(out.model_dump_json()) == {
        "Nodes": None,
        "NodeNames": ["a"],
        "FailedNodes": {"b": "no GPU with 0.50 free: best has 0.25"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_priority_list_and_binding_round_trip() -> None:
    prios = HostPriorityList([HostPriority(Host="a", Score=7)])
    assert json.loads(prios.model_dump_json()) == [{"Host": "a", "Score": 7}]
    raw = '{"PodName":"p1","PodNamespace":"default","PodUID":"6f0c","Node":"gpu-node-0"}'
    args = ExtenderBindingArgs.model_validate_json(raw)
    assert json.loads(args.model_dump_json()) == json.loads(raw)
    assert ExtenderBindingResult(Error="x").model_dump() == {"Error": "x"}
