"""One broken GPU never spoils the node's reading; health rules (lost, ECC, XID) and MIG processes."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from agent.nvml.base import NvmlCode
from agent.nvml.sample import Sampler
from agent.simgpu import simfile
from agent.simgpu.simulated import SimulatedNvml


def sampler(path: Path) -> tuple[Sampler, list[NvmlCode]]:
    s = SimulatedNvml(path, "n1")
    s.init()
    codes: list[NvmlCode] = []
    return Sampler(s, on_error=codes.append), codes


def test_faulty_node_reports_every_gpu_with_its_own_health() -> None:
    smp, codes = sampler(simfile.sample("faults"))
    sample = smp.sample()
    assert sample.error == ""
    assert [g.index for g in sample.gpus] == [0, 1, 2, 3]
    healthy, lost, ecc, mig = sample.gpus
    assert healthy.healthy and healthy.power_mw is None and healthy.ecc_uncorrected is None
    assert healthy.memory_free_mib == healthy.memory_total_mib
    assert not lost.healthy and "GPU_IS_LOST" in lost.reason
    assert not ecc.healthy and ecc.reason == "critical XID 79"
    assert mig.healthy and mig.mig_enabled
    assert [(p.pid, p.mig_uuid) for p in mig.processes] == [(5301, mig.mig_devices[0].uuid)]
    assert codes.count(NvmlCode.GPU_IS_LOST) == 1
    assert codes.count(NvmlCode.NOT_SUPPORTED) >= 2  # G2 power and ECC


def test_ecc_errors_alone_make_a_gpu_unhealthy(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"gpus": [{"model": "T4", "ecc_uncorrected": 3}]}))
    (gpu,) = sampler(path)[0].sample().gpus
    assert (gpu.healthy, gpu.reason) == (False, "3 uncorrected ECC errors since driver load")


def test_application_xid_is_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"gpus": [{"model": "T4", "xids": [13, 31]}]}))
    (gpu,) = sampler(path)[0].sample().gpus
    assert gpu.healthy


def test_fatal_xid_stays_unhealthy_after_it_was_drained(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"gpus": [{"model": "T4", "xids": [48]}]}))
    smp, _ = sampler(path)
    assert not smp.sample().gpus[0].healthy
    assert not smp.sample().gpus[0].healthy  # XID already drained; still unhealthy


def test_gpu_lost_later_keeps_its_identity(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"gpus": [{"model": "T4"}, {"model": "L4"}]}))
    smp, _ = sampler(path)
    before = smp.sample().gpus[1]
    path.write_text(yaml.safe_dump({"gpus": [{"model": "T4"}, {"model": "L4", "lost": True}]}))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    after = smp.sample().gpus[1]
    assert (after.uuid, after.model, after.memory_total_mib) == (before.uuid, "L4", before.memory_total_mib)
    assert not after.healthy and after.memory_used_mib is None


def test_whole_node_failure_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"gpus": [{"model": "T4"}]}))
    s = SimulatedNvml(path)  # never initialised: every call is UNINITIALIZED
    sample = Sampler(s).sample()
    assert sample.gpus == () and "UNINITIALIZED" in sample.error
