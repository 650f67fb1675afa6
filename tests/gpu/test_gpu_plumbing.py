"""The tenancy and memory-limit tests' machinery without a GPU: cudadrv.py over the stand-in driver, the
namespaces a client runs in, other uids, cgroup v2 leaves, stand-in limits, the answers file.

These run in CI so a GPU session spends its minutes on the GPU, not on harness bugs. Stand-ins are named.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuclients import CUDADRV, Clients
from gpuhelpers import Report
from gpuhost import (
    CGROUP_ROOT,
    NOBODY,
    Leaves,
    StandInLimits,
    driver_major,
    driver_missing,
    memacct_missing,
    namespace_argv,
    namespaces_missing,
    root_missing,
)
from gpuquestions import QUESTIONS
from test_gpu_tenancy import CHART_DAEMON_FLAGS

from app.core import names

HERE = Path(__file__).parent
FAKE_DIR = HERE / "fakecuda"
MIB = 1 << 20


@pytest.fixture
def drv(monkeypatch: pytest.MonkeyPatch) -> Clients:
    """cudadrv.py over the stand-in driver (fakecuda/fakedriver.py), one 8 GiB GPU."""
    monkeypatch.setenv("GPUPACK_FAKE_CUDA", "1")
    monkeypatch.setenv("PYTHONPATH", str(FAKE_DIR))
    monkeypatch.setenv("FAKE_CUDA_MEMORY_MIB", "8192")
    return Clients("libcuda", "stand-in", script=CUDADRV)


def _v2_root() -> Path | None:
    for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        if (root / "cgroup.controllers").exists() and os.access(root, os.W_OK):
            return root
    return None


@pytest.fixture
def leaves() -> Iterator[Leaves]:
    root = _v2_root()
    if root is None or root_missing():
        pytest.skip("no writable cgroup v2 hierarchy here (needs root)")
    lv = Leaves(root, enable=())
    yield lv
    assert lv.close() == []


# --- cudadrv.py ---


def test_driver_client_allocates_until_the_driver_refuses(drv: Clients) -> None:
    r = drv.run("alloc", ["--cap-mib", "9000"], {})
    assert r.rc == 0, r
    assert (r.body["max_mib"], r.body["capped"], r.body["refusal"]) == (
        8192,
        False,
        "CUDA_ERROR_OUT_OF_MEMORY",
    )
    assert r.body["pid"] > 0 and r.body["uid"] == os.getuid()


def test_driver_client_without_a_device_answers_with_the_cuda_error(drv: Clients) -> None:
    r = drv.run("meminfo", [], {names.ENV_CUDA_VISIBLE_DEVICES: ""})
    assert r.rc == 3 and r.body["cuda_error"] == "CUDA_ERROR_NO_DEVICE", r


def test_driver_client_holds_until_released(drv: Clients) -> None:
    proc = drv.start("hold", ["--mib", "1024"], {})
    ready = drv.ready(proc, 30)
    assert ready == {"ready": True, "pid": proc.pid, "held_mib": 1024}
    done = Clients.release(proc, 30)
    assert done.rc == 0 and done.body["failure"] == "" and done.body["touches"] >= 1


def test_ready_says_timed_out_for_a_client_that_stays_silent() -> None:
    proc = subprocess.Popen(
        ["sleep", "30"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert Clients("x", "y").ready(proc, 0.5) == {"error": "no answer within 0.5s", "timed_out": True}
    finally:
        proc.kill()
        proc.wait()


def test_driver_client_reaches_a_daemon_through_a_directory_holding_only_control(
    drv: Clients, tmp_path: Path
) -> None:
    """Stand-in MPS daemon: the pinned env limit counts only when `control` answers, also via a hard link."""
    pipe = tmp_path / "pipe"
    ctl = str(FAKE_DIR / "nvidia-cuda-mps-control")
    env = os.environ | {names.ENV_MPS_PIPE_DIRECTORY: str(pipe)}
    assert subprocess.run([ctl, "-d", "-M"], env=env, check=False).returncode == 0
    try:
        pod = tmp_path / "pod"
        pod.mkdir()
        for _ in range(50):
            if (pipe / "control").exists():
                break
            subprocess.run(["sleep", "0.1"], check=False)
        os.link(pipe / "control", pod / "control")
        limit = {names.ENV_MPS_MEMORY_LIMIT: "0=2048M"}
        via_pod = drv.run("alloc", ["--cap-mib", "4096"], limit | {names.ENV_MPS_PIPE_DIRECTORY: str(pod)})
        no_daemon = drv.run(
            "alloc", ["--cap-mib", "4096"], limit | {names.ENV_MPS_PIPE_DIRECTORY: str(tmp_path)}
        )
    finally:
        subprocess.run([ctl], input="quit\n", text=True, env=env, check=False)
    assert via_pod.body["max_mib"] == 2048, via_pod
    assert no_daemon.body["capped"], no_daemon


def test_fake_control_refuses_options_it_does_not_know(tmp_path: Path) -> None:
    env = os.environ | {names.ENV_MPS_PIPE_DIRECTORY: str(tmp_path)}
    out = subprocess.run(
        [str(FAKE_DIR / "nvidia-cuda-mps-control"), "-d", "--bogus"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 1 and "Unrecognized option --bogus" in out.stderr


# --- namespaces, uids, cgroups ---


@pytest.mark.parametrize("shm", ["private", "daemon"])
def test_namespace_prefix_gives_a_container_like_ipc_and_shm(drv: Clients, shm: str) -> None:
    why = namespaces_missing() or root_missing()
    if why:
        pytest.skip(why)
    r = drv.run("meminfo", [], {}, prefix=namespace_argv(shm, pid=True))
    assert r.rc == 0, r
    assert r.body["ipc_ns"] != os.readlink("/proc/self/ns/ipc")
    assert r.body["mnt_ns"] != os.readlink("/proc/self/ns/mnt")
    assert (r.body["shm_dev"] != os.stat("/dev/shm").st_dev) is (shm == "private")
    assert r.body["pid"] == 1  # its own pid namespace: the client is its first process


def test_namespace_prefix_refuses_an_unknown_shm() -> None:
    with pytest.raises(ValueError, match="shm 'host'"):
        namespace_argv("host")


def test_driver_client_drops_to_another_uid(drv: Clients) -> None:
    if root_missing():
        pytest.skip(root_missing())
    r = drv.run("meminfo", ["--uid", str(NOBODY), "--gid", str(NOBODY)], {})
    assert r.rc == 0 and r.body["uid"] == NOBODY, r


def test_a_client_in_a_leaf_gets_that_leafs_stand_in_limit(
    drv: Clients, leaves: Leaves, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = StandInLimits(tmp_path / "limits.json", leaves)
    monkeypatch.setenv("FAKE_CUDA_LIMITS", str(limits.path))
    leaf, other = leaves.leaf("a"), leaves.leaf("b")
    limits.set("GPU-x", leaf, 0, 3000 * MIB)
    inside = drv.run("alloc", ["--cap-mib", "6000", "--cgroup", str(leaf)], {})
    beside = drv.run("alloc", ["--cap-mib", "6000", "--cgroup", str(other)], {})
    assert inside.body["cgroup"] == leaves.relative(leaf) == f"/gpupack-gpu-{os.getpid()}/a"
    assert (inside.body["max_mib"], inside.body["total_mib"]) == (3000, 3000), inside
    assert (beside.body["max_mib"], beside.body["total_mib"]) == (6000, 8192), beside
    limits.clear("GPU-x", leaf)
    assert limits.get("GPU-x", leaf)["hard"] == 0xFFFFFFFFFFFFFFFF


def test_driver_client_says_why_it_could_not_join_a_cgroup(drv: Clients, tmp_path: Path) -> None:
    r = drv.run("meminfo", ["--cgroup", str(tmp_path / "nope")], {})
    assert r.rc == 3 and "could not enter cgroup" in r.body["error"], r


# --- host facts ---


@pytest.mark.parametrize(
    ("version", "major"), [("615.10", 615), ("580.159.04", 580), ("", None), ("r620", None)]
)
def test_driver_major(version: str, major: int | None) -> None:
    assert driver_major(version) == major


def test_memory_limits_need_r615_and_cgroup_v2(tmp_path: Path) -> None:
    assert "older than r615" in driver_missing("580.159.04")
    assert driver_missing("615.00") == ""
    assert "not a cgroup v2 hierarchy" in memacct_missing("615.00", tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu memory dmem\n")
    assert memacct_missing("615.00", tmp_path) == ""


# --- the answers ---


def test_answers_file_gives_each_question_its_answer_or_why_not() -> None:
    r = Report(environment={"driver_version": "580.1", "rehearsal": True})
    r.askers = {"shm-need": ["tests/gpu/t.py::test_a"], "soft-evict": ["tests/gpu/t.py::test_b"]}
    r.answer("shm-need", "private /dev/shm: served by MPS", client={"max_mib": 2048})
    r.outcome("tests/gpu/t.py::test_a", "passed", "", 1.0)
    r.outcome("tests/gpu/t.py::test_b", "skipped", "driver 580.1 is older than r615", 0.0)
    text = r.answers_markdown(QUESTIONS)
    assert "REHEARSAL" in text
    shm = text.split("## shm-need")[1].split("## ")[0]
    assert (
        "**private /dev/shm: served by MPS**" in shm and '"max_mib": 2048' in shm and "test_a` passed" in shm
    )
    evict = text.split("## soft-evict")[1]
    assert "test_b` skipped: driver 580.1 is older than r615" in evict and "not answered in this run" in evict
    assert all(f"## {qid}" in text for qid in QUESTIONS)


def test_readme_lists_every_question() -> None:
    readme = (HERE / "README.md").read_text()
    missing = [qid for qid in QUESTIONS if f"`{qid}`" not in readme]
    assert missing == [], f"tests/gpu/README.md does not list {missing}"


def test_the_chart_runs_the_daemon_as_the_suite_checks() -> None:
    """The multi-user spelling the suite checks on a GPU is the one the chart passes by default (legacy
    MPS; `agent.mps.protocol: 3` passes v3's `-p 3 -m` instead), read from the rendered manifest."""
    import yaml

    docs = yaml.safe_load_all((HERE.parents[1] / "deploy/manifests/gpupack.yaml").read_text())
    (daemon,) = [
        c
        for d in docs
        if d and d.get("kind") == "DaemonSet"
        for c in d["spec"]["template"]["spec"]["containers"]
        if c.get("command") and c["command"][0].endswith("nvidia-cuda-mps-control")
    ]
    assert tuple(daemon["command"][1:]) == CHART_DAEMON_FLAGS, daemon["command"]
