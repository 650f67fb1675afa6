"""The simulated NVML backend answers like NVML (errors, MIG, processes); pynvml error mapping."""

from __future__ import annotations

import os
from pathlib import Path

import pynvml
import pytest
import yaml

from agent import metrics as m
from agent.nvml import pynvml_backend
from agent.nvml.base import NvmlCode, NvmlError
from agent.nvml.pynvml_backend import PynvmlBackend, translate
from agent.simgpu import simfile
from agent.simgpu.simulated import SimulatedNvml
from app.core import catalog


def write(path: Path, doc: object) -> Path:
    path.write_text(yaml.safe_dump(doc))
    # Bump mtime explicitly: two writes within the filesystem's timestamp granularity must still differ.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    return path


def sim(path: Path, node: str = "n1") -> SimulatedNvml:
    s = SimulatedNvml(path, node)
    s.init()
    return s


def code_of(fn: object, *args: object) -> NvmlCode:
    with pytest.raises(NvmlError) as exc:
        fn(*args)  # type: ignore[operator]
    return exc.value.code


@pytest.fixture
def faults() -> SimulatedNvml:
    return sim(simfile.sample("faults"))


def test_sample_files_load() -> None:
    for name in ("a100x4", "t4x2", "faults"):
        assert simfile.load(simfile.sample(name), "n").gpus


def test_basic_queries_follow_the_catalogue(tmp_path: Path) -> None:
    s = sim(
        write(
            tmp_path / "g.yaml", {"gpus": [{"model": "T4", "base_used_mib": 300, "utilization_percent": 7}]}
        )
    )
    t4 = catalog.lookup("T4")
    assert s.device_count() == 1
    assert s.name(0) == t4.aliases[0]
    assert s.uuid(0).startswith("GPU-")
    mem = s.memory(0)
    assert (mem.total_mib, mem.used_mib, mem.free_mib) == (t4.memory_mib, 300, t4.memory_mib - 300)
    assert s.utilization(0).gpu_percent == 7


def test_uuids_are_stable_per_node_and_differ_between_nodes(tmp_path: Path) -> None:
    path = write(tmp_path / "g.yaml", {"gpus": [{"model": "T4"}, {"model": "T4"}]})
    a, b, other = sim(path, "n1"), sim(path, "n1"), sim(path, "n2")
    assert [a.uuid(0), a.uuid(1)] == [b.uuid(0), b.uuid(1)]
    assert a.uuid(0) != a.uuid(1)
    assert {a.uuid(0), a.uuid(1)}.isdisjoint({other.uuid(0), other.uuid(1)})


def test_calls_before_init_are_uninitialized(tmp_path: Path) -> None:
    s = SimulatedNvml(write(tmp_path / "g.yaml", {"gpus": [{"model": "T4"}]}))
    assert code_of(s.device_count) is NvmlCode.UNINITIALIZED
    assert code_of(s.memory, 0) is NvmlCode.UNINITIALIZED


def test_index_out_of_range_is_invalid_argument(faults: SimulatedNvml) -> None:
    assert code_of(faults.uuid, 4) is NvmlCode.INVALID_ARGUMENT


def test_lost_gpu_raises_gpu_is_lost_on_every_call(faults: SimulatedNvml) -> None:
    calls = [
        faults.uuid,
        faults.name,
        faults.memory,
        faults.utilization,
        faults.temperature_c,
        faults.power_mw,
        faults.ecc_uncorrected,
        faults.xid_errors,
        faults.mig_enabled,
        faults.processes,
    ]
    assert {code_of(c, 1) for c in calls} == {NvmlCode.GPU_IS_LOST}
    assert faults.device_count() == 4  # NVML still counts a lost GPU
    assert faults.memory(0).total_mib == catalog.lookup("G2").memory_mib  # its neighbours still answer


def test_model_without_power_reports_not_supported(faults: SimulatedNvml) -> None:
    assert code_of(faults.power_mw, 0) is NvmlCode.NOT_SUPPORTED
    assert code_of(faults.ecc_uncorrected, 0) is NvmlCode.NOT_SUPPORTED
    assert faults.power_mw(2) > 0  # V100 reports power


def test_mig_queries_on_a_gpu_without_mig_are_not_supported(faults: SimulatedNvml) -> None:
    assert code_of(faults.mig_enabled, 0) is NvmlCode.NOT_SUPPORTED
    assert code_of(faults.mig_device_count, 2) is NvmlCode.NOT_SUPPORTED
    assert code_of(faults.mig_device, 2, 0) is NvmlCode.NOT_SUPPORTED


def test_mig_devices_and_their_processes(faults: SimulatedNvml) -> None:
    assert faults.mig_enabled(3) is True
    assert faults.mig_device_count(3) == 7
    first = faults.mig_device(3, 0)
    assert (first.memory_total_mib, first.memory_used_mib) == (19968, 4096)
    assert first.uuid.startswith("MIG-")
    assert [p.pid for p in faults.processes(3, 0)] == [5301]
    assert faults.processes(3, 1) == ()
    assert code_of(faults.mig_device, 3, 2) is NvmlCode.NOT_FOUND  # empty slot
    assert code_of(faults.mig_device, 3, 7) is NvmlCode.INVALID_ARGUMENT
    assert faults.memory(3).used_mib == 4096  # the parent's memory covers its MIG devices


def test_mig_devices_report_their_profile_and_its_memory_by_default(tmp_path: Path) -> None:
    path = tmp_path / "mig.yaml"
    layout = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    write(
        path,
        {
            "gpus": [
                {"model": "A100-80GB", "mig": {"enabled": True, "devices": [{"profile": p} for p in layout]}}
            ]
        },
    )
    s = SimulatedNvml(path, node="n1")
    s.init()
    devices = [s.mig_device(0, i) for i in range(4)]
    assert [d.profile for d in devices] == layout
    assert [d.memory_total_mib for d in devices] == [40192, 19968, 9728, 9728]
    assert len({d.uuid for d in devices} | {s.uuid(0)}) == 5  # own UUIDs, none the parent's
    assert code_of(s.mig_device, 0, 4) is NvmlCode.NOT_FOUND


def test_mig_profile_is_read_from_the_nvml_device_name() -> None:
    assert pynvml_backend.mig_profile_of("NVIDIA A100-SXM4-80GB MIG 1g.10gb") == "1g.10gb"
    assert pynvml_backend.mig_profile_of("NVIDIA H100 80GB HBM3 MIG 3g.40gb") == "3g.40gb"
    assert pynvml_backend.mig_profile_of("NVIDIA A100-SXM4-80GB") == ""


def test_process_list_on_a_mig_parent_is_refused(faults: SimulatedNvml) -> None:
    assert code_of(faults.processes, 3) is NvmlCode.NO_PERMISSION
    assert code_of(faults.utilization, 3) is NvmlCode.NOT_SUPPORTED


def test_mig_capable_gpu_with_mig_disabled_has_no_mig_devices(tmp_path: Path) -> None:
    s = sim(write(tmp_path / "g.yaml", {"gpus": [{"model": "A100-80GB"}]}))
    assert s.mig_enabled(0) is False
    assert code_of(s.mig_device, 0, 0) is NvmlCode.NOT_FOUND
    assert s.processes(0) == ()


def test_xids_are_delivered_once(faults: SimulatedNvml) -> None:
    assert faults.xid_errors(2) == (79,)
    assert faults.xid_errors(2) == ()


def test_init_error_is_raised_with_a_clear_message(tmp_path: Path) -> None:
    s = SimulatedNvml(write(tmp_path / "g.yaml", {"init_error": "NVML_ERROR_DRIVER_NOT_LOADED", "gpus": []}))
    with pytest.raises(NvmlError) as exc:
        s.init()
    assert exc.value.code is NvmlCode.DRIVER_NOT_LOADED
    assert "NVML not available" in str(exc.value)


def test_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = write(tmp_path / "g.yaml", {"gpus": [{"model": "T4"}]})
    s = sim(path)
    uuid = s.uuid(0)
    write(path, {"gpus": [{"model": "T4", "processes": [{"pid": 77, "used_mib": 900}]}]})
    assert s.device_count() == 1  # the agent's sample starts here; this is where the file is re-read
    assert [p.pid for p in s.processes(0)] == [77]
    assert s.memory(0).used_mib == 900
    assert s.uuid(0) == uuid


def test_invalid_edit_keeps_the_previous_set(tmp_path: Path) -> None:
    path = write(tmp_path / "g.yaml", {"gpus": [{"model": "T4"}]})
    s = sim(path)
    write(path, {"gpus": [{"model": "NoSuchGPU"}]})
    assert s.device_count() == 1
    assert s.name(0) == "Tesla T4"
    assert "gpus[0].model" in s.last_reload_error


@pytest.mark.parametrize(
    ("doc", "fields"),
    [
        ({"gpus": [{"model": "X9"}]}, ["gpus[0].model"]),
        ({"gpus": [{"model": "T4", "mig": {"enabled": True}}]}, ["gpus[0].mig.enabled"]),
        (
            {"gpus": [{"model": "T4", "memory_mib": 100, "processes": [{"pid": 1, "used_mib": 200}]}]},
            ["gpus[0]"],
        ),
        ({"gpus": [{"model": "T4", "processes": [{"used_mib": 2}]}]}, ["gpus[0].processes[0].pid"]),
        (
            {"gpus": [{"model": "T4", "not_supported": ["fan"]}, {"model": "T4", "lost": "yes"}]},
            ["gpus[0].not_supported", "gpus[1].lost"],
        ),
        (
            {
                "gpus": [
                    {"model": "T4", "processes": [{"pid": 5, "used_mib": 1}]},
                    {"model": "T4", "processes": [{"pid": 5, "used_mib": 1}]},
                ]
            },
            ["gpus[].processes[].pid"],
        ),
        (
            {
                "gpus": [
                    {
                        "model": "A100-40GB",
                        "mig": {"enabled": True, "devices": [{"profile": "1g.5gb"}]},
                        "processes": [{"pid": 3, "used_mib": 1}],
                    }
                ]
            },
            ["gpus[0].processes"],
        ),
        (
            {"gpus": [{"model": "A100-80GB", "mig": {"enabled": True, "devices": [{"profile": "1g.5gb"}]}}]},
            ["gpus[0].mig.devices[0].profile"],
        ),
        (
            {
                "gpus": [
                    {
                        "model": "A100-80GB",
                        "mig": {"enabled": True, "devices": [{"profile": "4g.40gb"}, {"profile": "4g.40gb"}]},
                    }
                ]
            },
            ["gpus[0].mig.devices"],
        ),
        ({"gpus": [], "init_error": "BROKEN", "colour": 1}, ["init_error", "colour"]),
        (
            {"gpus": [{"model": "T4", "utilization_percent": 101, "temprature_c": 3}]},
            ["gpus[0].temprature_c", "gpus[0].utilization_percent"],
        ),
    ],
)
def test_validation_names_every_bad_field(doc: object, fields: list[str]) -> None:
    with pytest.raises(simfile.SimFileError) as exc:
        simfile.parse(doc, "test.yaml")
    assert sorted(e.field for e in exc.value.errors) == sorted(fields)
    assert str(exc.value).startswith("test.yaml: ")


def test_pynvml_backend_without_a_driver_says_nvml_is_not_available() -> None:
    with pytest.raises(NvmlError) as exc:
        PynvmlBackend().init()
    assert exc.value.code is NvmlCode.LIBRARY_NOT_FOUND
    assert str(exc.value).startswith("NVML_ERROR_LIBRARY_NOT_FOUND: NVML not available: ")


@pytest.mark.parametrize("code", [c for c in NvmlCode if c is not NvmlCode.OTHER])
def test_pynvml_errors_map_to_their_code_names(code: NvmlCode) -> None:
    assert translate(pynvml.NVMLError(getattr(pynvml, code.value))).code is code


def test_unlisted_pynvml_code_maps_to_other() -> None:
    assert translate(pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)).code is NvmlCode.OTHER


def test_metrics_know_every_nvml_code() -> None:
    registry = m.registry()
    for code in NvmlCode:
        assert registry.get_sample_value("gpupack_agent_nvml_errors_total", {"code": code.value}) is not None


def test_pynvml_memory_limits_go_through_nvidias_structs_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-ml-py 13.615 binds nvmlDevice{Get,Set}MemoryLimits_v1 with structs filled in place; the
    backend passes the cgroup path as bytes and reads soft/hard/currentUsed back."""
    seen: dict[str, object] = {}

    def get(handle: object, limits: object) -> None:
        seen["get"] = limits.nameSpace  # type: ignore[attr-defined]
        limits.softLimit, limits.hardLimit, limits.currentUsed = 1, 2, 3  # type: ignore[attr-defined]

    def set_(handle: object, limits: object) -> None:
        seen["set"] = (limits.nameSpace, limits.softLimit, limits.hardLimit)  # type: ignore[attr-defined]

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: f"h{i}")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryLimits_v1", get)
    monkeypatch.setattr(pynvml, "nvmlDeviceSetMemoryLimits_v1", set_)
    backend = PynvmlBackend()
    assert backend.limits_bound
    got = backend.memory_limits(0, "/sys/fs/cgroup/kubepods/c1")
    assert (got.soft_bytes, got.hard_bytes, got.current_used_bytes) == (1, 2, 3)
    path = "/sys/fs/cgroup/kubepods/c1"
    assert seen["get"] in (path, path.encode())  # pynvml's structs read char* fields back as str
    backend.set_memory_limits(0, "/sys/fs/cgroup/kubepods/c1", 0, pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX)
    assert seen["set"] in ((p, 0, pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX) for p in (path, path.encode()))


def test_pynvml_without_the_binding_reports_limits_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(pynvml, "nvmlDeviceSetMemoryLimits_v1")
    backend = PynvmlBackend()
    assert not backend.limits_bound
    assert code_of(backend.memory_limits, 0, "/sys/fs/cgroup/x") is NvmlCode.NOT_SUPPORTED
