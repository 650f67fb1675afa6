"""Tenant MPS on a real GPU: what the node side assumes about a legacy daemon serving containers.

Clients are cudadrv.py processes (the driver API; no framework), started the way a container's process
starts: in its own IPC, mount (private /dev/shm) and pid namespace, as another uid, with only its pod's MPS
directory. "Served by MPS" is shown by the client's pinned-memory env: it only counts under MPS, so a
client that stops at it was served, one that passes it ran outside MPS.

Each test records its answer (gpu-answers.md); it fails where gpupack's design relies on the answer
(docs/node-side.md) and the GPU says otherwise, and it only records where the answer is NVIDIA's fact to
learn (e.g. serialization without multi-user).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuclients import ClientResult, Clients, wait_for
from gpuhelpers import Report
from gpuhost import NOBODY, namespace_argv, namespaces_missing, root_missing, setpriv_missing
from gpumps import Daemon, control

from agent.mpsdaemon.pipedirs import PipeDirs
from agent.nvml.base import ComputeMode, Nvml, NvmlError
from app.core import names

pytestmark = pytest.mark.gpu

CHART_DAEMON_FLAGS = ("-f", "-M")  # deploy/helm/gpupack/templates/mps-daemon.yaml (multiUser: true)
MULTIUSER_SPELLINGS = ("-M", "--multiuser-server", "-multiuser-server", "-m", "--multiuser")
LIMIT_MIB = 2048  # a client's pinned env limit: far below any data-center GPU's memory
SLACK_MIB = 64
WAIT_S = 20  # how long a client that should start at once may take; one that waits longer is "waiting"


def _limit_env(d: Daemon, pipe: Path | None = None) -> dict[str, str]:
    return {
        names.ENV_CUDA_VISIBLE_DEVICES: d.uuid,
        names.ENV_MPS_PIPE_DIRECTORY: str(pipe or d.pipe_dir),
        names.ENV_MPS_MEMORY_LIMIT: f"0={LIMIT_MIB}M",
    }


def _served(r: ClientResult) -> bool:
    """An alloc client stopped at its pinned env limit: MPS served it (outside MPS the env is inert)."""
    return "error" not in r.body and not r.body["capped"] and int(r.body["max_mib"]) <= LIMIT_MIB + SLACK_MIB


def _alloc(driver: Clients, env: dict[str, str], prefix: list[str] | None = None) -> ClientResult:
    return driver.run("alloc", ["--cap-mib", str(LIMIT_MIB + 4096)], env, timeout_s=120, prefix=prefix or [])


@pytest.fixture
def legacy(real_nvml: Nvml, mps_binary: str, report: Report) -> Iterator[Daemon]:
    """A legacy daemon as the chart runs it (-M), adopted by the agent's supervisor."""
    d = Daemon(real_nvml, mps_binary, flags=("-M",))
    d.start()
    yield d
    report.fact("tenancy_mps_stop_seconds", round(d.stop(), 2))


# --- the daemon's options ---


@pytest.mark.answers("multiuser-flag")
def test_the_installed_daemon_accepts_the_charts_multiuser_command(
    real_nvml: Nvml, mps_binary: str, report: Report
) -> None:
    accepted: dict[str, object] = {}
    for flag in MULTIUSER_SPELLINGS:
        d = Daemon(real_nvml, mps_binary, flags=(flag,), adopt=False)
        out = d.launch()
        up = out.returncode == 0 and d.answers(5)
        accepted[flag] = {
            "started": up,
            "rc": out.returncode,
            "said": (out.stdout + out.stderr).strip()[-300:],
        }
        if up:
            d.stop()
    helptext = subprocess.run([mps_binary, "-h"], capture_output=True, text=True, timeout=20, check=False)
    # The chart's exact command runs in the foreground: the daemon lives as long as this process.
    d = Daemon(real_nvml, mps_binary, adopt=False)
    env = os.environ | {names.ENV_MPS_PIPE_DIRECTORY: str(d.pipe_dir), names.ENV_CUDA_VISIBLE_DEVICES: d.uuid}
    fg = subprocess.Popen([mps_binary, *CHART_DAEMON_FLAGS], env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    chart_up = d.answers(10)
    if chart_up:
        d.stop()
    fg.kill() if fg.poll() is None else None
    said = (fg.communicate(timeout=20)[0] or "").strip()[-300:]
    ok = [f for f, v in accepted.items() if v["started"]]  # type: ignore[index]
    report.answer(
        "multiuser-flag",
        f"accepted: {', '.join(ok) or 'none'}; the chart's `{' '.join(CHART_DAEMON_FLAGS)}` "
        f"{'starts' if chart_up else 'does NOT start'}",
        spellings=accepted,
        chart_said=said,
        help=(helptext.stdout + helptext.stderr)[-1500:],
    )
    assert chart_up, f"the chart's daemon command {CHART_DAEMON_FLAGS} did not start: {said}"


@pytest.mark.answers("pinned-uuid")
def test_pinned_default_set_by_gpu_uuid_caps_a_client(
    real_nvml: Nvml, mps_binary: str, driver: Clients, report: Report
) -> None:
    d = Daemon(real_nvml, mps_binary, adopt=False)
    d.start()
    try:
        set_ = d.control(f"set_default_device_pinned_mem_limit {d.uuid} {LIMIT_MIB}M")
        by_uuid = d.control(f"get_default_device_pinned_mem_limit {d.uuid}")
        by_index = d.control("get_default_device_pinned_mem_limit 0")
        env = {names.ENV_CUDA_VISIBLE_DEVICES: d.uuid, names.ENV_MPS_PIPE_DIRECTORY: str(d.pipe_dir)}
        r = _alloc(driver, env)  # no env limit of its own: only the daemon default can stop it
    finally:
        d.stop()
    applied = _served(r)
    report.answer(
        "pinned-uuid",
        f"set by UUID: rc {set_.returncode}; a client without its own limit "
        f"{'stops at' if applied else 'PASSES'} {LIMIT_MIB} MiB",
        set_said=(set_.stdout + set_.stderr).strip(),
        get_by_uuid=(by_uuid.stdout + by_uuid.stderr).strip(),
        get_by_index=(by_index.stdout + by_index.stderr).strip(),
        client=r.body,
    )
    assert set_.returncode == 0, f"set by UUID refused: {set_.stdout} {set_.stderr}"
    assert applied, f"a default set by UUID did not cap the client: {r.body} {r.stderr}"


# --- containers: namespaces, /dev/shm, the pod's own directory ---


@pytest.mark.answers("shm-need")
@pytest.mark.parametrize(
    ("shm", "pid", "poddir"),
    [("private", False, False), ("daemon", False, False), ("private", True, False), ("private", True, True)],
    ids=["private-shm", "daemon-shm", "private-shm+pidns", "as-gpupack-gives-it"],
)
def test_a_client_in_its_own_namespaces_is_served(
    legacy: Daemon, driver: Clients, report: Report, *, shm: str, pid: bool, poddir: bool
) -> None:
    why = namespaces_missing()
    if why:
        pytest.skip(why)
    pipe = legacy.pipe_dir
    if poddir:
        made = PipeDirs(legacy.pipe_dir).ensure("gpu-suite-pod")
        assert isinstance(made, Path), made
        pipe = made
    r = _alloc(driver, _limit_env(legacy, pipe), prefix=namespace_argv(shm, pid=pid))
    mine = os.stat("/dev/shm").st_dev
    variant = f"{shm} /dev/shm{', own pid namespace' if pid else ''}{', pod dir only' if poddir else ''}"
    report.answer(
        "shm-need",
        f"{variant}: {'served by MPS' if _served(r) else 'NOT served'}",
        client=r.body,
        stderr=r.stderr[-500:],
        own_shm=r.body.get("shm_dev") != mine,
        own_ipc=r.body.get("ipc_ns") != os.readlink("/proc/self/ns/ipc"),
    )
    assert r.body.get("ipc_ns") != os.readlink("/proc/self/ns/ipc"), "the client shared our IPC namespace"
    assert (r.body.get("shm_dev") != mine) is (shm == "private"), "the /dev/shm variant did not take"
    # gpupack gives no daemon shm (docs/node-side.md): a client must be served without it.
    assert _served(r), f"{variant}: the client was not served by MPS: {r.body} {r.stderr[-500:]}"


@pytest.mark.answers("poddir-client", "poddir-control")
def test_a_client_with_only_its_pod_directory(legacy: Daemon, driver: Clients, report: Report) -> None:
    why = setpriv_missing()
    if why:
        pytest.skip(why)
    made = PipeDirs(legacy.pipe_dir).ensure("gpu-suite-pod")
    assert isinstance(made, Path), made
    listing = sorted(p.name for p in made.iterdir())
    r = _alloc(driver, _limit_env(legacy, made))
    report.answer(
        "poddir-client",
        f"{'served by MPS' if _served(r) else 'NOT served'} with only {listing} in its directory",
        client=r.body,
        stderr=r.stderr[-500:],
    )
    tried: dict[str, dict[str, object]] = {}
    # Harmless commands first; `quit` last, as the other uid and then as root.
    current = "set_default_active_thread_percentage 100"  # the value the supervisor already set
    for who, uid in (("uid 65534", NOBODY), ("root", None)):
        for cmd in ("get_server_list", current, "quit"):
            out = control(legacy.config.binary, made, cmd, uid)
            tried[f"{who}: {cmd}"] = {"rc": out.returncode, "said": (out.stdout + out.stderr).strip()[-200:]}
        if not legacy.answers(2):
            break
    # A client's control commands go through its pod dir's link, not the daemon's own pipe dir.
    report.answer(
        "poddir-control",
        "; ".join(f"{k}: rc {v['rc']}" for k, v in tried.items()),
        tried=tried,
    )
    assert _served(r), f"a client with only {listing} was not served: {r.body} {r.stderr[-500:]}"
    # The binary exits 0 when the daemon refuses (docs/node-side.md, "MPS as measured"): only its words and
    # a daemon still answering tell a refused quit from one that worked.
    for who in ("uid 65534", "root"):
        quit_ = tried[f"{who}: quit"]
        assert "Not enough privilege" in str(quit_["said"]), f"{who} could quit through its pod dir: {quit_}"
        setting = tried[f"{who}: {current}"]
        assert "Insufficient privileges" in str(setting["said"]), f"{who} changed a default: {setting}"
    assert legacy.answers(2), "the daemon stopped answering after a tenant's commands"


# --- two uids at once ---


@pytest.mark.parametrize(
    "multiuser",
    [
        pytest.param(True, id="multi-user", marks=pytest.mark.answers("uids-multiuser")),
        pytest.param(False, id="single-user", marks=pytest.mark.answers("uids-single")),
    ],
)
def test_clients_of_two_uids(
    real_nvml: Nvml, mps_binary: str, driver: Clients, report: Report, multiuser: bool
) -> None:
    why = root_missing()
    if why:
        pytest.skip(why)
    # Without -M a server runs as each client's uid: open dirs, so the answer is about sharing, not modes.
    d = Daemon(real_nvml, mps_binary, flags=("-M",) if multiuser else (), open_dirs=not multiuser)
    d.start()
    env = _limit_env(d)
    first = driver.start("hold", ["--mib", "512"], env)
    second: subprocess.Popen[str] | None = None
    try:
        a = driver.ready(first, WAIT_S)
        second = driver.start("hold", ["--mib", "512", "--uid", str(NOBODY), "--gid", str(NOBODY)], env)
        t0 = time.monotonic()
        b = driver.ready(second, WAIT_S)
        b_while_a = bool(b.get("ready"))
        servers_both = d.control("get_server_list").stdout.split()
        a_done = Clients.release(first)
        if not b_while_a and b.get("timed_out"):
            b = driver.ready(second, 60)
        b_after_s = round(time.monotonic() - t0, 1)
        b_done = Clients.release(second)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
        d.stop()
    qid = "uids-multiuser" if multiuser else "uids-single"
    later = "" if b_while_a else f", then ready {bool(b.get('ready'))} ({b_after_s}s after it started)"
    report.answer(
        qid,
        f"{'-M' if multiuser else 'no -M'}: root client {'ready' if a.get('ready') else 'NOT ready'}; "
        f"uid {NOBODY} client {'ready while root held' if b_while_a else 'waited'}{later}",
        root=a,
        other=b,
        root_end=a_done.body,
        other_end=b_done.body,
        servers_while_both=servers_both,
    )
    assert a.get("ready"), f"the root client did not start: {a} {a_done.stderr[-500:]}"
    if multiuser:
        assert b_while_a, (
            f"under -M the uid {NOBODY} client did not run beside root: {b} {b_done.stderr[-500:]}"
        )
    else:
        assert b.get("ready"), f"without -M the uid {NOBODY} client never ran: {b} {b_done.stderr[-500:]}"


# --- EXCLUSIVE_PROCESS ---


@pytest.fixture
def exclusive(real_nvml: Nvml, report: Report, real_processes: None) -> Iterator[Nvml]:
    """GPU 0 in EXCLUSIVE_PROCESS for the test (only while idle), its mode restored after."""
    why = root_missing()
    if why:
        pytest.skip(why)
    if real_nvml.processes(0):
        pytest.skip(
            f"GPU 0 is busy ({len(real_nvml.processes(0))} processes): its mode is not ours to switch"
        )
    before = real_nvml.compute_mode(0)
    try:
        real_nvml.set_compute_mode(0, ComputeMode.EXCLUSIVE_PROCESS)
    except NvmlError as exc:
        pytest.skip(f"cannot set EXCLUSIVE_PROCESS here: {exc}")
    try:
        yield real_nvml
    finally:
        wait_for(lambda: not real_nvml.processes(0), timeout_s=30)
        real_nvml.set_compute_mode(0, before)
        report.fact("exclusive_mode_restored", real_nvml.compute_mode(0).value)


def _plain(driver: Clients, uuid: str) -> ClientResult:
    """A process that dropped CUDA_MPS_PIPE_DIRECTORY (the default /tmp/nvidia-mps has no daemon of ours)."""
    return driver.run("meminfo", [], {names.ENV_CUDA_VISIBLE_DEVICES: uuid}, timeout_s=60)


@pytest.mark.answers("exclusive-server", "exclusive-idle")
def test_exclusive_process_keeps_a_process_without_the_pipe_dir_off_the_gpu(
    exclusive: Nvml, mps_binary: str, driver: Clients, report: Report
) -> None:
    uuid = exclusive.uuid(0)
    # No daemon: the first plain process holds the GPU, a second is refused (the mode took).
    holder = driver.start("hold", ["--mib", "256"], {names.ENV_CUDA_VISIBLE_DEVICES: uuid})
    held = driver.ready(holder, WAIT_S)
    second = _plain(driver, uuid)
    Clients.release(holder)
    d = Daemon(exclusive, mps_binary, flags=("-M",))
    d.start()
    try:
        idle = _plain(driver, uuid)  # daemon up, no server yet
        after_idle = _alloc(driver, _limit_env(d))  # can MPS still serve once that process is gone?
        # The server stays once its clients exit; with none running, a pre-started one closes the window.
        listed = d.control("get_server_list").stdout.split()
        for pid in listed:
            d.control(f"shutdown_server {pid} -f")
        wait_for(lambda: not d.control("get_server_list").stdout.split(), 10)
        started = d.control("start_server -uid 0")
        prestarted = _plain(driver, uuid)  # a server runs before any client came
        client = driver.start("hold", ["--mib", "256"], _limit_env(d))
        mps_ready = driver.ready(client, WAIT_S)
        busy = _plain(driver, uuid)  # a server runs now
        Clients.release(client)
    finally:
        d.stop()
    report.answer(
        "exclusive-server",
        f"with a server running, a process without the pipe dir is "
        f"{'refused: ' + str(busy.body.get('cuda_error')) if 'error' in busy.body else 'NOT refused'}",
        plain=busy.body,
        mps_client=mps_ready,
        no_daemon={"first": held, "second": second.body},
    )
    report.answer(
        "exclusive-idle",
        f"daemon up, no server: a process without the pipe dir is "
        f"{'refused: ' + str(idle.body.get('cuda_error')) if 'error' in idle.body else 'NOT refused'}; "
        f"an MPS client after it is {'served' if _served(after_idle) else 'NOT served'}",
        plain=idle.body,
        mps_after=after_idle.body,
        prestarted={"start_server": (started.stdout + started.stderr).strip(), "plain": prestarted.body},
    )
    assert held.get("ready") and "error" in second.body, (
        f"EXCLUSIVE_PROCESS did not take: first {held}, second {second.body}"
    )
    assert mps_ready.get("ready"), f"an MPS client could not run in EXCLUSIVE_PROCESS: {mps_ready}"
    assert "error" in busy.body, f"a process without the pipe dir used the GPU beside MPS: {busy.body}"
    # Measured ("Compute mode"): with no server yet, a plain process is NOT refused; `start_server -uid 0`
    # closes that window. A driver that refuses it now would be news: the test says so.
    assert "error" not in idle.body, f"a plain process was refused with no MPS server running: {idle.body}"
    assert started.returncode == 0 and "error" in prestarted.body, (
        f"with a server started by `start_server -uid 0` ({started.stdout} {started.stderr}), a process "
        f"without the pipe dir was not refused: {prestarted.body}"
    )
