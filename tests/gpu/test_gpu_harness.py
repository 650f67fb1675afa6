"""The suite's machinery without a GPU: workload.py over a fake torch, nvidia-smi parsing, pod env, report.

These run in CI so that a GPU session spends its time on the GPU, not on harness bugs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuclients import Clients
from gpuhelpers import (
    GpuFacts,
    Report,
    allocation,
    fraction_request,
    inventory_mismatches,
    mps_capable,
    normalize_uuid,
    parse_smi,
    pod_env,
    report_path,
    resolve_env,
)

from app.core import names
from webhook.mutate import gpu_env

FAKE_DIR = Path(__file__).with_name("fakecuda")
FAKE = {"PYTHONPATH": str(FAKE_DIR), "FAKE_CUDA_MEMORY_MIB": "8192"}
FAKE_UUID = "GPU-11111111-2222-3333-4444-555555555555"


@pytest.fixture
def fake() -> Clients:
    return Clients("torch", "fake")


def _control(pipe: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FAKE_DIR / "nvidia-cuda-mps-control"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        env=os.environ | {names.ENV_MPS_PIPE_DIRECTORY: str(pipe)},
        check=False,
    )


@pytest.fixture
def mps_pipe(tmp_path: Path) -> Iterator[Path]:
    """A running fake MPS control daemon; its pipe dir."""
    pipe = tmp_path / "pipe"
    assert _control(pipe, "-d").returncode == 0
    yield pipe
    _control(pipe, stdin="quit")


# --- workload.py ---


def test_alloc_stops_at_the_pinned_limit_to_within_two_mib(fake: Clients, mps_pipe: Path) -> None:
    env = FAKE | {names.ENV_MPS_MEMORY_LIMIT: "0=3001M", names.ENV_MPS_PIPE_DIRECTORY: str(mps_pipe)}
    r = fake.run("alloc", ["--cap-mib", "6000"], env)
    assert r.rc == 0, r
    assert 3001 - 2 <= r.body["max_mib"] <= 3001 and not r.body["capped"]
    assert "OutOfMemoryError" in r.body["refusal"]


def test_alloc_reports_capped_when_everything_fit(fake: Clients) -> None:
    r = fake.run("alloc", ["--cap-mib", "5000"], FAKE)
    assert (r.rc, r.body["max_mib"], r.body["capped"]) == (0, 5000, True)


@pytest.mark.parametrize(
    ("visible", "count"),
    [(None, 1), (FAKE_UUID, 1), ("", 0), ("GPU-00000000-0000-0000-0000-000000000000", 0)],
)
def test_probe_lists_the_visible_devices(fake: Clients, visible: str | None, count: int) -> None:
    env = FAKE | ({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})
    r = fake.run("probe", [], env)
    assert r.rc == 0 and len(r.body["devices"]) == count
    if count:
        assert normalize_uuid(r.body["devices"][0]["uuid"]) == FAKE_UUID


def test_alloc_without_a_device_is_an_error_not_a_zero(fake: Clients) -> None:
    r = fake.run("alloc", [], FAKE | {"CUDA_VISIBLE_DEVICES": ""})
    assert r.rc == 0 and r.body["max_mib"] == 0 and "no CUDA-capable device" in r.body["refusal"]


def test_without_a_daemon_the_mps_variables_are_inert(fake: Clients, tmp_path: Path) -> None:
    env = FAKE | {names.ENV_MPS_MEMORY_LIMIT: "0=3001M", names.ENV_MPS_PIPE_DIRECTORY: str(tmp_path)}
    r = fake.run("alloc", ["--cap-mib", "6000"], env)
    assert (r.body["max_mib"], r.body["capped"]) == (6000, True)


def test_fake_control_behaves_like_the_real_one_where_the_suite_looks(mps_pipe: Path) -> None:
    assert _control(mps_pipe, "-d").returncode == 1  # one daemon per pipe dir
    assert _control(mps_pipe, stdin="set_default_device_pinned_mem_limit 0 8192M").returncode == 0
    assert _control(mps_pipe, stdin="get_default_device_pinned_mem_limit 0").stdout.strip() == "8192M"
    [pid] = _control(mps_pipe, stdin="get_server_list").stdout.split()
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "nvidia-cuda-mps"
    assert _control(mps_pipe, stdin="quit").returncode == 0
    assert _control(mps_pipe, stdin="get_server_list").returncode == 1


def test_matmul_rate_follows_the_thread_share_and_waits_for_start(fake: Clients, mps_pipe: Path) -> None:
    env = FAKE | {"FAKE_CUDA_MATMUL_S": "0.002", names.ENV_MPS_PIPE_DIRECTORY: str(mps_pipe)}
    start_at = time.time() + 3
    procs = {
        pct: fake.start(
            "matmul",
            ["--seconds", "1", "--start-at", str(start_at)],
            env | {names.ENV_MPS_THREAD_PERCENTAGE: pct},
        )
        for pct in ("50", "25")
    }
    got = {pct: Clients.finish(p, timeout_s=60).body for pct, p in procs.items()}
    assert not got["50"]["late_start"] and not got["25"]["late_start"]
    assert got["50"]["seconds"] >= 1.0
    assert 1.5 <= got["50"]["iters_per_s"] / got["25"]["iters_per_s"] <= 2.5, got


def test_hold_reports_ready_then_stops_when_stdin_closes(fake: Clients) -> None:
    proc = fake.start("hold", ["--mib", "512", "--seconds", "60"], FAKE)
    assert proc.stdout is not None and proc.stdin is not None
    ready = json.loads(proc.stdout.readline())
    assert ready == {"ready": True, "pid": proc.pid, "held_mib": 512}
    t0 = time.monotonic()
    proc.stdin.close()
    r = Clients.finish(proc, timeout_s=30)
    assert r.rc == 0 and r.body["iterations"] > 0
    assert time.monotonic() - t0 < 30


def test_hold_past_the_limit_is_an_error(fake: Clients) -> None:
    r = fake.run("hold", ["--mib", "9000"], FAKE)
    assert r.rc == 3 and "OutOfMemoryError" in r.body["error"]


# --- nvidia-smi, inventory, MPS capability ---

SMI = """0, GPU-5b7a8c1e-0d2f-4e3a-9b1c-7d6e5f4a3b2c, NVIDIA H100 80GB HBM3, 81559, Disabled, Default, 9.0
1, GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9, Tesla T4, 15360, [N/A], Prohibited, 7.5
"""


def test_parse_smi_reads_every_field() -> None:
    h100, t4 = parse_smi(SMI)
    assert h100 == GpuFacts(
        0, "GPU-5b7a8c1e-0d2f-4e3a-9b1c-7d6e5f4a3b2c", "NVIDIA H100 80GB HBM3", 81559, False, "Default", "9.0"
    )
    assert (t4.mig, t4.compute_mode, t4.memory_total_mib) == (None, "Prohibited", 15360)


@pytest.mark.parametrize("bad", ["0, GPU-x, name, 1", "x, GPU-x, n, 1, Disabled, Default, 9.0"])
def test_parse_smi_rejects_what_it_cannot_read(bad: str) -> None:
    with pytest.raises(ValueError, match="nvidia-smi line 1"):
        parse_smi(bad)


def test_inventory_mismatches_name_the_field_and_both_values() -> None:
    ref = parse_smi(SMI)
    ours = [ref[0], GpuFacts(1, ref[1].uuid, "Tesla T4", 15000, None)]
    assert inventory_mismatches(ours, ref) == ["GPU 1 memory_total_mib: backend 15000, reference 15360"]
    assert inventory_mismatches(ours[:1], ref) == ["GPU count: backend 1, reference 2"]


def test_mps_capability_reasons() -> None:
    h100, t4 = parse_smi(SMI)
    assert mps_capable(h100, "/usr/bin/nvidia-cuda-mps-control") == (True, "")
    assert mps_capable(h100, None)[0] is False
    assert mps_capable(t4, "/bin/x") == (False, "compute mode is Prohibited")


@pytest.mark.parametrize(
    "raw",
    [
        "GPU-5b7a8c1e-0d2f-4e3a-9b1c-7d6e5f4a3b2c",
        "5b7a8c1e-0d2f-4e3a-9b1c-7d6e5f4a3b2c",
        "5B7A8C1E0D2F4E3A9B1C7D6E5F4A3B2C",
    ],
)
def test_normalize_uuid_accepts_nvml_torch_and_cupy_spellings(raw: str) -> None:
    assert normalize_uuid(raw) == "GPU-5b7a8c1e-0d2f-4e3a-9b1c-7d6e5f4a3b2c"


def test_normalize_uuid_rejects_a_short_one() -> None:
    with pytest.raises(ValueError, match="32 hex digits"):
        normalize_uuid("GPU-1234")


# --- the env a pod gets ---


def test_pod_env_is_the_webhook_env_resolved_from_the_allocation() -> None:
    req = fraction_request("0.25")
    alloc = allocation(req, "n1", 0, "GPU-abc", 81559)
    env = pod_env(gpu_env(req), alloc, Path("/run/mps-host"))
    assert env == {
        names.ENV_NVIDIA_VISIBLE_DEVICES: "GPU-abc",
        names.ENV_CUDA_VISIBLE_DEVICES: "GPU-abc",
        names.ENV_MEMORY_LIMIT_MIB: str(81559 // 4),
        names.ENV_MPS_THREAD_PERCENTAGE: "25",
        names.ENV_MPS_MEMORY_LIMIT: f"0={81559 // 4}M",
        names.ENV_MPS_PIPE_DIRECTORY: "/run/mps-host",
    }


def test_resolve_env_reads_missing_annotations_as_empty() -> None:
    env = [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['x']"}}}]
    assert resolve_env(env, {}) == {"A": ""}
    with pytest.raises(ValueError, match="not an annotation reference"):
        resolve_env([{"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}], {})


def test_fraction_request_rejects_a_bad_fraction() -> None:
    with pytest.raises(ValueError, match=names.GPU_FRACTION):
        fraction_request("1.5")


# --- the report ---


def test_report_path_prefers_the_explicit_variable(tmp_path: Path) -> None:
    assert report_path({"GPUPACK_GPU_REPORT": "/x/r.json", "OUT": "/o"}) == Path("/x/r.json")
    assert report_path({"OUT": "/o"}) == Path("/o/gpu-report.json")
    assert report_path({}) is None


def test_report_keeps_the_first_non_pass_and_sums_durations(tmp_path: Path) -> None:
    r = Report()
    r.outcome("t::a", "passed", "", 0.5)
    r.outcome("t::a", "failed", "boom", 1.0)
    r.outcome("t::a", "passed", "", 0.25)
    r.outcome("t::b", "skipped", "no GPU", 0.0)
    r.fact("split", {"half": 2.0})
    r.write(tmp_path / "out" / "r.json")
    body = json.loads((tmp_path / "out" / "r.json").read_text())
    assert body["summary"] == {"failed": 1, "skipped": 1}
    assert body["tests"]["t::a"] == {"outcome": "failed", "detail": "boom", "duration_s": 1.75}
    assert body["facts"] == {"split": {"half": 2.0}}
