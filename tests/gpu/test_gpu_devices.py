"""Device selection: CUDA_VISIBLE_DEVICES=<GPU UUID> (what the kubelet resolves from gpupack.io/gpu-uuids)
shows exactly that GPU to a CUDA process; an empty or unknown value shows none (the webhook fails closed)."""

from __future__ import annotations

import pytest
from gpuclients import Clients
from gpuhelpers import Report, normalize_uuid

from agent.nvml.base import Nvml

pytestmark = pytest.mark.gpu


def test_each_gpu_uuid_selects_exactly_that_gpu(real_nvml: Nvml, clients: Clients, report: Report) -> None:
    seen = {}
    for i in range(real_nvml.device_count()):
        uuid = real_nvml.uuid(i)
        r = clients.run("probe", [], {"CUDA_VISIBLE_DEVICES": uuid})
        assert r.rc == 0, f"probe with {uuid} failed: {r.body} {r.stderr}"
        devices = r.body["devices"]
        seen[uuid] = devices
        assert len(devices) == 1, f"CUDA_VISIBLE_DEVICES={uuid} shows {len(devices)} devices: {devices}"
        assert normalize_uuid(devices[0]["uuid"]) == normalize_uuid(uuid)
        assert devices[0]["total_mib"] <= real_nvml.memory(i).total_mib
    report.fact("device_selection", seen)


@pytest.mark.parametrize(
    "value", ["", "GPU-00000000-0000-0000-0000-000000000000"], ids=["empty", "unknown-uuid"]
)
def test_empty_or_unknown_uuid_selects_no_gpu(clients: Clients, report: Report, value: str) -> None:
    r = clients.run("probe", [], {"CUDA_VISIBLE_DEVICES": value})
    report.fact(f"device_selection_{value or 'empty'}", r.body)
    # Either CUDA reports no device, or initialization fails: both keep the pod off every GPU.
    assert "error" in r.body or r.body["devices"] == [], r.body
