"""Fixtures of the GPU suite: the real NVML backend (or a clear skip), CUDA client processes, the JSON report.

Tests marked `gpu` need a GPU that NVML can see; without one they skip with NVML's own reason, so CI
stays green. Nothing here imports torch, CuPy or pynvml at module level.

GPUPACK_GPU_REHEARSAL=1 runs the GPU tests without a GPU against stand-ins (tests/gpu/fakecuda: a
simulated H100 behind the agent's simulated NVML backend, a fake torch, nvidia-smi and MPS control), to
shake out harness bugs before a GPU session; tests that need NVML to see real processes skip.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuclients import CUDADRV, WORKLOAD, Clients
from gpuhelpers import Report, report_path
from gpuhost import REHEARSAL
from gpumps import stop_leftovers
from gpuquestions import QUESTIONS

from agent.nvml.base import Nvml, NvmlError

REPORT = Report()
FAKE_DIR = Path(__file__).with_name("fakecuda")
FAKE_UUID = "GPU-11111111-2222-3333-4444-555555555555"  # the fake torch's one GPU


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "answers(*ids): the gpuquestions.QUESTIONS this test answers")
    if not REHEARSAL:
        return
    os.environ["GPUPACK_FAKE_CUDA"] = "1"  # cudadrv.py over fakecuda/fakedriver.py instead of libcuda
    os.environ["PATH"] = f"{FAKE_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAKE_DIR), os.environ.get("PYTHONPATH")) if p)
    os.environ["FAKE_CUDA_MEMORY_MIB"] = "81559"
    os.environ["FAKE_CUDA_MATMUL_S"] = "0.001"
    os.environ["FAKE_NVIDIA_SMI_CSV"] = (
        f"0, {FAKE_UUID}, NVIDIA H100 80GB HBM3, 81559, Disabled, Default, 9.0"
    )
    os.environ.setdefault("GPUPACK_GPU_MATMUL_SECONDS", "1")
    os.environ.setdefault("GPUPACK_GPU_START_DELAY_SECONDS", "5")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for mark in item.iter_markers("answers"):
            for qid in mark.args:
                if qid not in QUESTIONS:
                    raise pytest.UsageError(
                        f"{item.nodeid}: answers({qid!r}) is not in gpuquestions.QUESTIONS"
                    )
                REPORT.askers.setdefault(qid, []).append(item.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "tests/gpu/" not in report.nodeid.replace("\\", "/"):
        return
    detail = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        detail = str(report.longrepr[2])
    elif report.failed:
        detail = report.longreprtext
    REPORT.outcome(report.nodeid, report.outcome, detail, report.duration)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = report_path(os.environ)
    if path is None or not REPORT.tests:
        return
    REPORT.environment.setdefault("python", platform.python_version())
    REPORT.environment["pytest_exit_status"] = int(exitstatus)
    REPORT.write(path)
    if REPORT.askers:
        path.with_name("gpu-answers.md").write_text(REPORT.answers_markdown(QUESTIONS))


@pytest.fixture(scope="session")
def report() -> Iterator[Report]:
    yield REPORT
    left = stop_leftovers()
    if left:
        REPORT.fact("mps_daemons_left_running", left)


def _real_backend() -> tuple[Nvml | None, str]:
    try:
        from agent.nvml.pynvml_backend import PynvmlBackend
    except ImportError as exc:
        return None, f"pynvml (nvidia-ml-py) is not importable: {exc}"
    nv = PynvmlBackend()
    try:
        nv.init()
        count = nv.device_count()
    except NvmlError as exc:
        return None, f"NVML finds no GPU here: {exc}"
    if count == 0:
        nv.shutdown()
        return None, "NVML finds no GPU here: device count is 0"
    return nv, ""


def _rehearsal_backend(tmp: Path) -> Nvml:
    from agent.simgpu.simulated import SimulatedNvml

    path = tmp / "h100.yaml"
    # r615: so the per-cgroup memory tests run their plumbing against the stand-ins too.
    path.write_text(
        f'driver_version: "615.00"\ngpus:\n  - {{model: H100-80GB, uuid: {FAKE_UUID}, base_used_mib: 0}}\n'
    )
    nv = SimulatedNvml(path)
    nv.init()
    return nv


@pytest.fixture(scope="session")
def real_nvml(report: Report, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nvml]:
    """The pynvml backend, initialized; skips the test where NVML finds no GPU."""
    if REHEARSAL:
        report.environment["rehearsal"] = True
        yield _rehearsal_backend(tmp_path_factory.mktemp("rehearsal"))
        return
    nv, why = _real_backend()
    if nv is None:
        pytest.skip(why)
    report.environment["driver_version"] = nv.driver_version()
    report.environment["gpus"] = [nv.name(i) for i in range(nv.device_count())]
    yield nv
    nv.shutdown()


@pytest.fixture(scope="session")
def clients(real_nvml: Nvml, report: Report) -> Clients:
    """CUDA client processes (torch, else CuPy); skips where neither can run a kernel."""
    probe = subprocess.run(
        [sys.executable, str(WORKLOAD), "probe"], capture_output=True, text=True, timeout=180, check=False
    )
    lines = [ln for ln in probe.stdout.splitlines() if ln.startswith("{")]
    body = json.loads(lines[-1]) if lines else {"error": probe.stderr[-500:]}
    if "error" in body:
        pytest.skip(f"no CUDA client library works here: {body['error']}")
    report.environment["cuda_client"] = f"{body['lib']} {body['lib_version']}"
    return Clients(body["lib"], body["lib_version"])


@pytest.fixture(scope="session")
def driver(real_nvml: Nvml, report: Report) -> Clients:
    """cudadrv.py clients (the CUDA driver API through ctypes; no framework); skips where libcuda fails."""
    probe = subprocess.run(
        [sys.executable, str(CUDADRV), "probe"], capture_output=True, text=True, timeout=120, check=False
    )
    lines = [ln for ln in probe.stdout.splitlines() if ln.startswith("{")]
    body = json.loads(lines[-1]) if lines else {"error": probe.stderr[-500:]}
    if "error" in body:
        pytest.skip(f"the CUDA driver API does not work here: {body['error']}")
    report.environment["cuda_driver_api"] = body["driver_version"]
    return Clients("libcuda", str(body["driver_version"]), script=CUDADRV)


@pytest.fixture
def real_processes() -> None:
    """For tests that need NVML itself to see CUDA processes: skipped in a rehearsal."""
    if REHEARSAL:
        pytest.skip("rehearsal: the simulated NVML backend cannot see real CUDA processes")


@pytest.fixture(scope="session")
def mps_binary() -> str:
    path = shutil.which("nvidia-cuda-mps-control")
    if path is None:
        pytest.skip("nvidia-cuda-mps-control is not on PATH (MPS is not installed here)")
    return path
