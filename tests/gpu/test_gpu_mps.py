"""MPS on a real GPU, through agent/mpsdaemon/mps.py: the limits a pod's env asks for, and whether they hold.

Each test starts its own control daemon the way the MPS daemon pod does (`nvidia-cuda-mps-control -d`, with
the pod's env) under a private pipe dir, has the agent's supervisor adopt it and set its defaults
(MpsSupervisor.tick), because daemon defaults only reach MPS servers spawned after they are set, and stops it
after with `quit`, as deleting that pod does.
Clients are workload.py processes with the env the webhook gives a pod (resolved from the allocation
annotations as the kubelet would), CUDA_MPS_PIPE_DIRECTORY pointing at the host side of the pipe mount.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuclients import ClientResult, Clients, wait_for
from gpuhelpers import Report
from gpumps import Daemon, mps_processes

from agent.mpsdaemon.mps import Device, MpsState
from agent.nvml.base import Nvml
from app.core import names

pytestmark = pytest.mark.gpu

# Slack for the allocator's rounding (2 MiB pages, alignment) when comparing with a MiB limit.
SLACK_MIB = 64
# How long each throughput client runs, and how long side-by-side clients get to warm up before both start.
MATMUL_SECONDS = float(os.environ.get("GPUPACK_GPU_MATMUL_SECONDS", "8"))
START_DELAY_SECONDS = float(os.environ.get("GPUPACK_GPU_START_DELAY_SECONDS", "30"))


@pytest.fixture
def daemon(real_nvml: Nvml, mps_binary: str, report: Report) -> Iterator[Daemon]:
    d = Daemon(real_nvml, mps_binary)
    d.start()
    yield d
    report.fact("mps_stop_seconds", round(d.stop(), 2))


def _ok(r: ClientResult) -> dict[str, object]:
    assert r.rc == 0 and "error" not in r.body, f"client failed (rc {r.rc}): {r.body} {r.stderr}"
    return r.body


@pytest.mark.parametrize("fraction", ["0.5", "0.25"])
def test_client_cannot_allocate_past_its_pinned_limit(
    daemon: Daemon, clients: Clients, report: Report, fraction: str
) -> None:
    env, limit = daemon.pod_env(fraction)
    assert env[names.ENV_MPS_MEMORY_LIMIT] == f"0={limit}M"
    cap = limit + 4096  # would fit on the GPU: only the MPS limit can stop the client below it
    body = _ok(clients.run("alloc", ["--cap-mib", str(cap)], env))
    report.fact(f"mps_pinned_limit_{fraction}", {"limit_mib": limit, "env": env, **body})
    assert not body["capped"], f"the client allocated {cap} MiB past its {limit} MiB limit"
    assert int(str(body["max_mib"])) <= limit + SLACK_MIB
    assert int(str(body["max_mib"])) >= limit // 2, "the client was stopped far below its limit"


def test_without_mps_the_same_client_passes_that_limit(
    real_nvml: Nvml, clients: Clients, report: Report
) -> None:
    """The control for the test above: the GPU itself would have let the client past the limit."""
    uuid, total = real_nvml.uuid(0), real_nvml.memory(0).total_mib
    limit = total // 4
    body = _ok(clients.run("alloc", ["--cap-mib", str(limit + 4096)], {"CUDA_VISIBLE_DEVICES": uuid}))
    report.fact("no_mps_alloc", body)
    assert body["capped"], f"without MPS the client still stopped at {body['max_mib']} MiB"


def test_daemon_default_caps_a_client_that_asks_for_more(
    real_nvml: Nvml, mps_binary: str, clients: Clients, report: Report
) -> None:
    """DESIGN "Facts to design around": can a client raise CUDA_MPS_PINNED_DEVICE_MEM_LIMIT above the
    daemon's default? gpupack caps daemon-side and relies on the answer being no."""
    default_mib = 8192
    d = Daemon(real_nvml, mps_binary, pinned_default_mib=default_mib)
    d.start()
    try:
        shown = d.control(f"get_default_device_pinned_mem_limit {d.uuid}").stdout.strip()
        base = {
            "CUDA_VISIBLE_DEVICES": d.uuid,
            names.ENV_MPS_PIPE_DIRECTORY: str(d.pipe_dir),
        }
        plain = _ok(clients.run("alloc", ["--cap-mib", str(3 * default_mib)], base))
        asks = 2 * default_mib
        raised = _ok(
            clients.run(
                "alloc",
                ["--cap-mib", str(3 * default_mib)],
                base | {names.ENV_MPS_MEMORY_LIMIT: f"0={asks}M"},
            )
        )
    finally:
        report.fact("mps_stop_seconds_raise", round(d.stop(), 2))
    can_raise = int(str(raised["max_mib"])) > default_mib + SLACK_MIB
    report.fact(
        "mps_client_raise",
        {
            "daemon_default_mib": default_mib,
            "daemon_says": shown,
            "client_asks_mib": asks,
            "no_env_max_mib": plain["max_mib"],
            "asking_more_max_mib": raised["max_mib"],
            "client_can_raise_limit": can_raise,
        },
    )
    assert int(str(plain["max_mib"])) <= default_mib + SLACK_MIB, "the daemon default did not apply"
    assert not can_raise, (
        f"a client asking {asks} MiB got {raised['max_mib']} MiB past the daemon's {default_mib} MiB: "
        "the daemon-side cap does not hold"
    )


def test_thread_percentage_splits_throughput(daemon: Daemon, clients: Clients, report: Report) -> None:
    seconds = MATMUL_SECONDS
    env_half, _ = daemon.pod_env("0.5")
    env_quarter, _ = daemon.pod_env("0.25")
    assert (env_half[names.ENV_MPS_THREAD_PERCENTAGE], env_quarter[names.ENV_MPS_THREAD_PERCENTAGE]) == (
        "50",
        "25",
    )
    full = {k: v for k, v in env_half.items() if k != names.ENV_MPS_THREAD_PERCENTAGE}
    solo = {
        name: _ok(clients.run("matmul", ["--seconds", str(seconds)], env))
        for name, env in (("full", full), ("half", env_half), ("quarter", env_quarter))
    }
    start_at = time.time() + START_DELAY_SECONDS  # both clients are warmed up and waiting by then
    procs = {
        name: clients.start("matmul", ["--seconds", str(seconds), "--start-at", str(start_at)], env)
        for name, env in (("half", env_half), ("quarter", env_quarter))
    }
    together = {name: _ok(Clients.finish(p, timeout_s=180)) for name, p in procs.items()}
    rate = {k: float(str(v["iters_per_s"])) for k, v in solo.items()}
    both = {k: float(str(v["iters_per_s"])) for k, v in together.items()}
    split = {
        "solo_iters_per_s": rate,
        "together_iters_per_s": both,
        "solo_tflops": {k: v["tflops"] for k, v in solo.items()},
        "together_late_start": {k: v["late_start"] for k, v in together.items()},
        "solo_half_over_full": round(rate["half"] / rate["full"], 3),
        "solo_quarter_over_full": round(rate["quarter"] / rate["full"], 3),
        "together_half_over_quarter": round(both["half"] / both["quarter"], 3),
    }
    report.fact("mps_throughput_split", split)
    assert not any(v["late_start"] for v in together.values()), "a client started late: overlap unknown"
    # The promise: a 50 % client does about twice the work of a 25 % one, alone or side by side.
    assert split["together_half_over_quarter"] >= 1.4, split
    assert split["solo_quarter_over_full"] <= 0.6, split


def test_daemon_serves_clients_that_nvml_attributes_and_stops_cleanly(
    real_nvml: Nvml, mps_binary: str, clients: Clients, report: Report, real_processes: None
) -> None:
    import pynvml

    d = Daemon(real_nvml, mps_binary)
    d.start()
    env, _ = d.pod_env("0.5")
    proc = clients.start("hold", ["--mib", "1024", "--seconds", "120"], env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert '"ready": true' in line, f"MPS client did not get ready: {line!r}\n{d.logs()}"
        pid = int(json.loads(line)["pid"])
        servers = d.control("get_server_list").stdout.split()
        assert servers and all(s.isdigit() for s in servers), f"no MPS server listed: {servers!r}"
        listed: dict[str, object] = {}

        def seen() -> bool:
            h = pynvml.nvmlDeviceGetHandleByIndex(d.index)
            listed["compute"] = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
            try:
                listed["mps"] = [p.pid for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h)]
            except pynvml.NVMLError as exc:
                listed["mps"] = str(exc)
            listed["backend"] = [p.pid for p in real_nvml.processes(d.index)]
            return pid in listed["backend"]  # type: ignore[operator]

        found = wait_for(seen, timeout_s=30, interval_s=0.5)
        listed["mps_processes"] = mps_processes(d.pipe_dir)
        listed["client_pid"], listed["server_list"] = pid, servers
        report.fact("mps_nvml_listing", listed)
        other_namespace = bool(listed["backend"]) and not any(
            Path(f"/proc/{p}").exists()
            for p in listed["backend"]  # type: ignore[attr-defined]
        )
        # NVML names host pids; from inside a pid namespace they are not ours to find (see the pid test).
        assert found or other_namespace, f"the backend did not list MPS client {pid}: {listed}"
    finally:
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=60)
        stop_s = d.stop()
    report.fact("mps_stop_seconds_clean", round(stop_s, 2))
    assert d.sup.tick([Device(d.uuid, d.memory_mib)], now=time.monotonic()).state == MpsState.STARTING
    # The supervisor's liveness probe reads a failed exit as "no daemon": check that it really is one.
    after = d.control("get_server_list")
    report.fact(
        "mps_probe_after_quit", {"rc": after.returncode, "output": (after.stdout + after.stderr)[-300:]}
    )
    assert after.returncode != 0
