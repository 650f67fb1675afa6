"""The NVML backend against a real GPU: inventory vs nvidia-smi, live readings, pid -> pod, error codes.

Inventory and error-mapping tests run twice: on the simulated backend (always, so CI exercises the
assertions) and on the real pynvml backend (marker `gpu`; skipped where NVML finds no GPU).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from gpuclients import Clients, wait_for
from gpuhelpers import (
    SMI_ARGV,
    GpuFacts,
    Report,
    inventory,
    inventory_mismatches,
    mps_capable,
    parse_smi,
    sim_reference,
)

from agent.enforce.cgroup import ProcResolver
from agent.enforce.verify import Kind, verify
from agent.mpsdaemon.mps import MpsConfig, MpsSupervisor
from agent.nvml.base import Nvml, NvmlCode, NvmlError
from agent.nvml.sample import Sampler
from agent.simgpu import simfile
from agent.simgpu.simulated import SimulatedNvml
from app.core.model import Allocation
from app.core.pods import PodInfo

REPO = Path(__file__).resolve().parents[2]

# A mixed simulated node: no-MIG T4, MIG-capable H100 with MIG off, A100 with MIG on and one instance.
SIM_NODE = {
    "driver_version": "550.54.15",
    "gpus": [
        {"model": "T4"},
        {"model": "H100-80GB", "base_used_mib": 512},
        {
            "model": "A100-40GB",
            "mig": {"enabled": True, "devices": [{"profile": "1g.5gb", "memory_mib": 4864}]},
        },
    ],
}


@pytest.fixture
def sim_path(tmp_path: Path) -> Path:
    p = tmp_path / "node.yaml"
    p.write_text(yaml.safe_dump(SIM_NODE))
    return p


@pytest.fixture
def sim_nvml(sim_path: Path) -> Iterator[SimulatedNvml]:
    nv = SimulatedNvml(sim_path, node="gpu-suite")
    nv.init()
    yield nv


def smi_inventory() -> list[GpuFacts]:
    out = subprocess.run(list(SMI_ARGV), capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        pytest.fail(f"{' '.join(SMI_ARGV)} failed ({out.returncode}): {out.stderr.strip()[:500]}")
    return parse_smi(out.stdout)


# --- inventory ---


def test_simulated_inventory_matches_its_file(sim_nvml: SimulatedNvml, sim_path: Path) -> None:
    ours = inventory(sim_nvml)
    assert inventory_mismatches(ours, sim_reference(simfile.load(sim_path, "gpu-suite"))) == []
    assert [g.mig for g in ours] == [None, False, True]


@pytest.mark.gpu
def test_real_inventory_matches_nvidia_smi(real_nvml: Nvml, report: Report) -> None:
    smi = smi_inventory()
    ours = inventory(real_nvml)
    binary = shutil.which("nvidia-cuda-mps-control")
    report.fact(
        "inventory",
        [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "memory_total_mib": g.memory_total_mib,
                "mig": g.mig,
                "compute_mode": g.compute_mode,
                "compute_cap": g.compute_cap,
                "mps_capable": mps_capable(g, binary)[0],
                "mps_reason": mps_capable(g, binary)[1],
            }
            for g in smi
        ],
    )
    assert inventory_mismatches(ours, smi) == []
    # MPS capability as the agent decides it: the control binary on PATH.
    assert MpsSupervisor(MpsConfig()).available() is (binary is not None)


@pytest.mark.gpu
def test_agent_sampler_reads_every_field_of_a_real_gpu(real_nvml: Nvml, report: Report) -> None:
    """What the agent publishes per GPU: nothing unexpectedly NOT_SUPPORTED, values in physical ranges."""
    sample = Sampler(real_nvml).sample()
    report.fact(
        "agent_sample",
        {
            "driver": sample.driver_version,
            "gpus": [
                {
                    "model": g.model,
                    "product_name": g.product_name,
                    "healthy": g.healthy,
                    "reason": g.reason,
                    "errors": [e.value for e in g.errors],
                    "temperature_c": g.temperature_c,
                    "power_mw": g.power_mw,
                    "utilization_percent": g.utilization_percent,
                    "ecc_uncorrected": g.ecc_uncorrected,
                    "mig_enabled": g.mig_enabled,
                    "memory_total_used_free_mib": [g.memory_total_mib, g.memory_used_mib, g.memory_free_mib],
                }
                for g in sample.gpus
            ],
        },
    )
    assert sample.error == "" and sample.driver_version
    for g in sample.gpus:
        assert g.healthy, f"GPU {g.index}: {g.reason}"
        assert g.model != g.product_name, f"{g.product_name!r} is not in the GPU catalogue (app/core/data)"
        # MIG mode has no whole-GPU utilisation; other NOT_SUPPORTED codes are a surprise on a datacenter GPU.
        expected = {NvmlCode.NOT_SUPPORTED} if g.mig_enabled else set()
        assert set(g.errors) <= expected, f"GPU {g.index} errors: {g.errors}"
        assert g.temperature_c is not None and 5 <= g.temperature_c <= 110
        assert g.power_mw is not None and g.power_mw > 0
        assert g.memory_used_mib is not None and g.memory_free_mib is not None
        assert g.memory_used_mib + g.memory_free_mib <= g.memory_total_mib


# --- error mapping ---


def test_simulated_bad_index_is_invalid_argument(sim_nvml: SimulatedNvml) -> None:
    with pytest.raises(NvmlError) as exc:
        sim_nvml.uuid(sim_nvml.device_count())
    assert exc.value.code is NvmlCode.INVALID_ARGUMENT


@pytest.mark.gpu
def test_real_bad_index_is_invalid_argument(real_nvml: Nvml) -> None:
    for bad in (real_nvml.device_count(), 4096):
        with pytest.raises(NvmlError) as exc:
            real_nvml.memory(bad)
        assert exc.value.code is NvmlCode.INVALID_ARGUMENT, f"index {bad}: {exc.value}"


def test_simulated_calls_outside_init_are_uninitialized(sim_path: Path) -> None:
    nv = SimulatedNvml(sim_path)
    with pytest.raises(NvmlError) as before:
        nv.device_count()
    nv.init()
    assert nv.device_count() == 3
    nv.shutdown()
    with pytest.raises(NvmlError) as after:
        nv.uuid(0)
    assert (before.value.code, after.value.code) == (NvmlCode.UNINITIALIZED, NvmlCode.UNINITIALIZED)


# Run in a fresh interpreter: pynvml's state is process-global and the session's backend holds an init.
_UNINIT_SCRIPT = textwrap.dedent(
    """
    import json
    from agent.nvml.base import NvmlError
    from agent.nvml.pynvml_backend import PynvmlBackend

    def code(fn):
        try:
            fn()
        except NvmlError as exc:
            return exc.code.value
        return "no error"

    nv = PynvmlBackend()
    before = code(nv.device_count)
    nv.init()
    count = nv.device_count()
    nv.shutdown()
    after = code(lambda: nv.uuid(0))
    print(json.dumps({"before": before, "count": count, "after": after}))
    """
)


@pytest.mark.gpu
def test_real_calls_outside_init_are_uninitialized(real_nvml: Nvml, real_processes: None) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _UNINIT_SCRIPT],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-1000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {
        "before": NvmlCode.UNINITIALIZED.value,
        "count": real_nvml.device_count(),
        "after": NvmlCode.UNINITIALIZED.value,
    }


_NO_LIBRARY_SCRIPT = textwrap.dedent(
    """
    import json
    import pynvml

    def no_library(*_args, **_kw):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    pynvml.CDLL = no_library  # what the loader says on a node without the driver
    pynvml.nvmlLib = None
    from agent.nvml.base import NvmlError
    from agent.nvml.pynvml_backend import PynvmlBackend

    try:
        PynvmlBackend().init()
        print(json.dumps({"code": "no error"}))
    except NvmlError as exc:
        print(json.dumps({"code": exc.code.value, "message": str(exc)}))
    """
)


def test_real_backend_without_the_library_is_library_not_found() -> None:
    """The pynvml backend where libnvidia-ml cannot be loaded (here forced, so it holds on a GPU node too)."""
    pytest.importorskip("pynvml")
    out = subprocess.run(
        [sys.executable, "-c", _NO_LIBRARY_SCRIPT],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-1000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["code"] == NvmlCode.LIBRARY_NOT_FOUND.value
    assert "NVML not available" in got["message"]


# --- live readings and pid -> pod, on a real GPU with a real CUDA process ---


def _hold(clients: Clients, uuid: str, mib: int) -> tuple[subprocess.Popen[str], int]:
    proc = clients.start("hold", ["--mib", str(mib), "--seconds", "120"], {"CUDA_VISIBLE_DEVICES": uuid})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("{") or not json.loads(line).get("ready"):
        proc.kill()
        _out, err = proc.communicate()
        pytest.fail(f"the CUDA client did not get ready: {line!r} {err[-1500:]}")
    return proc, int(json.loads(line)["pid"])


def _release(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.gpu
def test_live_memory_and_utilization_follow_a_cuda_process(
    real_nvml: Nvml, clients: Clients, report: Report, real_processes: None
) -> None:
    index, held = 0, 4096
    uuid = real_nvml.uuid(index)
    base = real_nvml.memory(index).used_mib
    proc, pid = _hold(clients, uuid, held)
    seen: dict[str, object] = {}
    try:

        def grown() -> bool:
            mem, util = real_nvml.memory(index), real_nvml.utilization(index)
            procs = {p.pid: p.used_mib for p in real_nvml.processes(index)}
            seen.update(used=mem.used_mib, util=util.gpu_percent, procs=procs)
            return mem.used_mib >= base + held and util.gpu_percent >= 50 and pid in procs

        ok = wait_for(grown, timeout_s=30, interval_s=0.5)
    finally:
        _release(proc)
    report.fact("live_while_holding", {"base_used_mib": base, "held_mib": held, **seen})
    assert ok, f"NVML did not follow the process (base {base} MiB, held {held} MiB): {seen}"
    used = seen["procs"][pid]  # type: ignore[index]
    assert used is None or used >= held, f"pid {pid} used_mib {used} < {held}"

    def released() -> bool:
        seen["after_used"] = real_nvml.memory(index).used_mib
        seen["after_pids"] = [p.pid for p in real_nvml.processes(index)]
        return pid not in seen["after_pids"] and int(seen["after_used"]) < base + held // 2  # type: ignore[arg-type]

    assert wait_for(released, timeout_s=30, interval_s=0.5), f"memory not released after exit: {seen}"


@pytest.mark.gpu
def test_agent_maps_the_nvml_pid_to_its_process_and_pod(
    real_nvml: Nvml, clients: Clients, report: Report, tmp_path: Path, real_processes: None
) -> None:
    index, held = 0, 2048
    uuid = real_nvml.uuid(index)
    proc, pid = _hold(clients, uuid, held)
    try:
        sampler = Sampler(real_nvml)
        sample = None

        def listed() -> bool:
            nonlocal sample
            sample = sampler.sample()
            return any(p.pid == pid for g in sample.gpus for p in g.processes)

        found = wait_for(listed, timeout_s=30, interval_s=0.5)
        assert sample is not None
        nvml_pids = [p.pid for g in sample.gpus for p in g.processes]
        report.fact("pid_mapping", {"client_pid": pid, "nvml_pids": nvml_pids})
        if not found and nvml_pids and not any(Path(f"/proc/{p}").exists() for p in nvml_pids):
            pytest.skip(
                f"NVML reports pids {nvml_pids} that this pid namespace cannot see; the agent runs with "
                "hostPID, run the suite in the host pid namespace"
            )
        assert found, f"NVML never listed the client pid {pid}: {nvml_pids}"
        # The real /proc entry NVML's pid names is our client (a host process: no pod).
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert "workload.py" in cmdline
        assert ProcResolver(Path("/proc")).pod_of(pid) is None
        # The same pid under a kubelet-style cgroup path is attributed to that pod and checked.
        pod_uid, cid = str(uuidlib.uuid4()), "ab" * 32
        cg = tmp_path / "proc" / str(pid) / "cgroup"
        cg.parent.mkdir(parents=True)
        cg.write_text(
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"
        )
        resolver = ProcResolver(tmp_path / "proc")
        refs = {p: resolver.pod_of(p) for p in nvml_pids}

        def pod(limit_mib: int) -> dict[str, PodInfo]:
            alloc = Allocation("node", (index,), (uuid,), 500, limit_mib)
            return {
                pod_uid: PodInfo(
                    pod_uid, "ns", "p", allocation=alloc, gpu_container="main", containers={cid: "main"}
                )
            }

        within = verify(sample, refs, pod(1 << 20))
        over = verify(sample, refs, pod(held // 2))
    finally:
        _release(proc)
    assert within.owners[pid] == pod_uid
    [usage] = within.usage
    report.fact("pid_mapping_usage_mib", usage.used_mib)
    assert usage.pids == (pid,) and usage.used_mib >= held
    assert within.violations == ()
    assert [v.kind for v in over.violations] == [Kind.OVER_MEMORY]


# --- the real backend's process listing, over stand-in pynvml calls (CI) ---


def _fake_lists(monkeypatch: pytest.MonkeyPatch, compute: list[object], mps: object) -> None:
    import pynvml

    def mps_list(_h: object) -> object:
        if isinstance(mps, Exception):
            raise mps
        return mps

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: f"handle-{i}")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda _h: compute)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMPSComputeRunningProcesses", mps_list)


def _proc(pid: int, used_mib: int | None) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(pid=pid, usedGpuMemory=None if used_mib is None else used_mib << 20)


def test_backend_lists_mps_clients_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.nvml.base import ProcessInfo
    from agent.nvml.pynvml_backend import PynvmlBackend

    # The MPS server in the plain list; its clients in the MPS list (one also in both, without memory).
    _fake_lists(monkeypatch, [_proc(10, 600), _proc(11, None)], [_proc(11, 1024), _proc(12, None)])
    assert PynvmlBackend().processes(0) == (
        ProcessInfo(10, 600),
        ProcessInfo(11, 1024),
        ProcessInfo(12, None),
    )


@pytest.mark.parametrize("why", ["not_supported", "mismatch"])
def test_backend_without_the_mps_query_lists_compute_processes(
    monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    import pynvml

    from agent.nvml.base import ProcessInfo
    from agent.nvml.pynvml_backend import PynvmlBackend

    err: Exception = (
        pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if why == "not_supported"
        else pynvml.NVMLLibraryMismatchError("use a versioned function")
    )
    _fake_lists(monkeypatch, [_proc(10, 600)], err)
    assert PynvmlBackend().processes(0) == (ProcessInfo(10, 600),)


def test_backend_process_listing_on_a_lost_gpu_raises_gpu_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    from agent.nvml.pynvml_backend import PynvmlBackend

    _fake_lists(monkeypatch, [], pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    with pytest.raises(NvmlError) as exc:
        PynvmlBackend().processes(0)
    assert exc.value.code is NvmlCode.GPU_IS_LOST


def test_a_library_mismatch_is_function_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    from agent.nvml.pynvml_backend import PynvmlBackend

    def mismatch(_h: object) -> object:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: f"handle-{i}")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", mismatch)
    with pytest.raises(NvmlError) as exc:
        PynvmlBackend().memory(0)
    assert exc.value.code is NvmlCode.FUNCTION_NOT_FOUND
