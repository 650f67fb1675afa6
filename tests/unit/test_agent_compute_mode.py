"""Compute modes: the simulated NVML follows NVML's contract; MPS GPUs are switched only while idle."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from agent.mpsdaemon import mpsprep
from agent.nvml.base import ComputeMode, NvmlCode, NvmlError
from agent.simgpu.simulated import SimulatedNvml

EXCL, DEFAULT = ComputeMode.EXCLUSIVE_PROCESS, ComputeMode.DEFAULT


def sim(tmp_path: Path, gpus: list[dict[str, object]], **kw: object) -> SimulatedNvml:
    path = tmp_path / "gpus.yaml"
    path.write_text(yaml.safe_dump({"gpus": gpus}))
    nvml = SimulatedNvml(path, "n1", **kw)  # type: ignore[arg-type]
    nvml.init()
    return nvml


def test_set_compute_mode_needs_privilege_and_a_live_gpu(tmp_path: Path) -> None:
    nvml = sim(tmp_path, [{"model": "T4"}, {"model": "T4", "lost": True}], privileged=False)
    assert nvml.compute_mode(0) is DEFAULT
    with pytest.raises(NvmlError) as denied:
        nvml.set_compute_mode(0, EXCL)
    assert denied.value.code is NvmlCode.NO_PERMISSION
    assert nvml.compute_mode(0) is DEFAULT
    root = sim(tmp_path, [{"model": "T4"}, {"model": "T4", "lost": True}], privileged=True)
    with pytest.raises(NvmlError) as lost:
        root.set_compute_mode(1, EXCL)
    assert lost.value.code is NvmlCode.GPU_IS_LOST
    with pytest.raises(NvmlError) as bad:
        root.set_compute_mode(0, "EXCLUSIVE_THREAD")  # type: ignore[arg-type]
    assert bad.value.code is NvmlCode.INVALID_ARGUMENT
    root.shutdown()
    with pytest.raises(NvmlError) as uninit:
        root.compute_mode(0)
    assert uninit.value.code is NvmlCode.UNINITIALIZED


def test_the_state_dir_is_the_driver_shared_by_processes_and_cleared_by_a_reload(tmp_path: Path) -> None:
    state = tmp_path / "driver"
    a = sim(tmp_path, [{"model": "T4"}], state_dir=state, privileged=True)
    b = sim(tmp_path, [{"model": "T4"}], state_dir=state, privileged=False)
    a.set_compute_mode(0, EXCL)
    assert b.compute_mode(0) is EXCL  # another process (the agent) sees the same driver
    for f in state.iterdir():
        f.unlink()  # driver reload / reboot
    assert b.compute_mode(0) is DEFAULT


def test_exclusive_process_refuses_a_plain_process_beside_mps_clients(tmp_path: Path) -> None:
    procs = [{"pid": 10, "used_mib": 100, "mps": True}, {"pid": 11, "used_mib": 100}]
    nvml = sim(tmp_path, [{"model": "T4", "processes": procs}], privileged=True)
    assert {p.pid for p in nvml.processes(0)} == {10, 11}  # DEFAULT: anyone gets a context
    nvml.set_compute_mode(0, EXCL)
    assert [p.pid for p in nvml.processes(0)] == [10]  # the plain process (no pipe dir) is refused


def test_a_bad_compute_mode_in_the_file_names_the_field(tmp_path: Path) -> None:
    from agent.simgpu.simfile import SimFileError, parse

    with pytest.raises(SimFileError) as bad:
        parse(
            {"gpus": [{"model": "T4", "compute_mode": "SHARED", "processes": [{"pid": 1, "mps": "y"}]}]}, "f"
        )
    text = str(bad.value)
    assert "gpus[0].compute_mode='SHARED': must be one of NVML_COMPUTEMODE_DEFAULT," in text
    assert "gpus[0].processes[0].mps" in text


def test_apply_switches_idle_gpus_only_and_the_ready_record_follows(tmp_path: Path) -> None:
    gpus = [
        {"model": "A100-40GB"},
        {"model": "A100-40GB", "processes": [{"pid": 7, "used_mib": 10}]},
        {"model": "A100-40GB", "mig": {"enabled": True, "devices": []}},
    ]
    nvml = sim(tmp_path, gpus, privileged=True)
    modes = mpsprep.apply(nvml, EXCL)
    assert [(m.mode, m.switched) for m in modes] == [(EXCL, True), (DEFAULT, False), (None, False)]
    assert modes[1].reason == "busy (1 processes): switched to NVML_COMPUTEMODE_EXCLUSIVE_PROCESS once idle"
    assert modes[2].reason == "MIG enabled: not shared through MPS"
    pipe = tmp_path / "pipe"
    mpsprep.write_ready(pipe, modes, "boot-1")
    assert json.loads((pipe / mpsprep.READY_FILE).read_text())["bootID"] == "boot-1"
    u0, u1 = modes[0].uuid, modes[1].uuid
    assert mpsprep.not_ready(pipe, [u0], EXCL, "boot-1") == ""
    assert "not in NVML_COMPUTEMODE_EXCLUSIVE_PROCESS" in mpsprep.not_ready(pipe, [u0, u1], EXCL, "boot-1")
    assert "since it booted" in mpsprep.not_ready(pipe, [u0], EXCL, "boot-2")
    assert "missing or unreadable" in mpsprep.not_ready(tmp_path / "none", [u0], EXCL, "boot-1")
    assert [m.switched for m in mpsprep.apply(nvml, EXCL)] == [False, False, False]  # idempotent


def test_keep_switches_nothing_and_only_the_boot_gates(tmp_path: Path) -> None:
    nvml = sim(tmp_path, [{"model": "T4", "compute_mode": EXCL.value}, {"model": "T4"}], privileged=True)
    modes = mpsprep.apply(nvml, None)
    assert [(m.mode, m.switched) for m in modes] == [(EXCL, False), (DEFAULT, False)]
    mpsprep.write_ready(tmp_path, modes, "b")
    assert mpsprep.not_ready(tmp_path, [modes[1].uuid], None, "b") == ""
    assert mpsprep.not_ready(tmp_path, [modes[1].uuid], None, "c") != ""


@pytest.mark.skipif(os.geteuid() != 0, reason="setting a compute mode needs root, as in NVML")
def test_prepare_mps_command_sets_idle_gpus_and_writes_the_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import build_parser

    sim_file = tmp_path / "gpus.yaml"
    busy = [{"pid": 9, "used_mib": 1}]
    sim_file.write_text(yaml.safe_dump({"gpus": [{"model": "T4"}, {"model": "T4", "processes": busy}]}))
    state, pipe = tmp_path / "driver", tmp_path / "pipe"
    argv = [
        "agent",
        "prepare-mps",
        "--sim",
        str(sim_file),
        "--sim-state",
        str(state),
        "--pipe-dir",
        str(pipe),
    ]
    args = build_parser().parse_args([*argv, "--node", "n1"])
    assert args.func(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(": NVML_COMPUTEMODE_EXCLUSIVE_PROCESS (switched)")
    assert out[1].endswith("NVML_COMPUTEMODE_DEFAULT; busy (1 processes): switched to "
                           "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS once idle")  # fmt: skip
    record = json.loads((pipe / mpsprep.READY_FILE).read_text())
    assert sorted(record["gpus"].values()) == [
        "NVML_COMPUTEMODE_DEFAULT",
        "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS",
    ]
    assert record["bootID"] == mpsprep.boot_id()
    agent_view = SimulatedNvml(sim_file, "n1", state_dir=state, privileged=False)
    agent_view.init()
    assert agent_view.compute_mode(0) is EXCL  # the agent (another process) sees the same driver
