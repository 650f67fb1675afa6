"""The dev cluster's relay: which endpoint of a Service it picks, and how it reads its arguments."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from tests.devcluster import relay

SERVICE = {
    "spec": {"ports": [{"name": "https", "port": 8888, "targetPort": "https"}, {"name": "ops", "port": 8889}]}
}


def endpoint(ip: str, ready: bool) -> dict[str, Any]:
    return {"addresses": [ip], "conditions": {"ready": ready}}


def test_picks_the_ready_endpoint_at_the_target_port_of_that_service_port() -> None:
    slices = [
        {
            "ports": [{"name": "ops", "port": 9889}, {"name": "https", "port": 9888}],
            "endpoints": [endpoint("10.250.0.5", False), endpoint("10.250.0.6", True)],
        }
    ]
    assert relay.ready_endpoint(SERVICE, slices, 8888) == ("10.250.0.6", 9888)
    assert relay.ready_endpoint(SERVICE, slices, 8889) == ("10.250.0.6", 9889)


@pytest.mark.parametrize(
    "slices",
    [
        [],  # no endpoints yet
        [
            {"ports": [{"name": "https", "port": 8888}], "endpoints": [endpoint("10.250.0.5", False)]}
        ],  # none ready
        [
            {"ports": [{"name": "other", "port": 1}], "endpoints": [endpoint("10.250.0.5", True)]}
        ],  # no such port
    ],
    ids=["no-slices", "none-ready", "port-missing"],
)
def test_no_ready_endpoint_is_none(slices: list[dict[str, Any]]) -> None:
    assert relay.ready_endpoint(SERVICE, slices, 8888) is None


def test_a_port_the_service_does_not_have_is_none() -> None:
    slices = [{"ports": [{"name": "https", "port": 8888}], "endpoints": [endpoint("10.250.0.5", True)]}]
    assert relay.ready_endpoint(SERVICE, slices, 443) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("127.0.0.1", "'127.0.0.1': must be HOST:PORT with a port in 1..65535"),
        ("127.0.0.1:0", "'127.0.0.1:0': must be HOST:PORT with a port in 1..65535"),
        (":80", "':80': must be HOST:PORT with a port in 1..65535"),
    ],
)
def test_bad_listen_addresses_name_the_rule(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        relay.host_port(text)
    assert str(err.value) == message


def test_service_reference() -> None:
    assert relay.service_ref("gpupack-system/gpupack-extender:8888") == (
        "gpupack-system",
        "gpupack-extender",
        8888,
    )
    with pytest.raises(argparse.ArgumentTypeError, match="must be NAMESPACE/NAME:PORT"):
        relay.service_ref("gpupack-extender:8888")
