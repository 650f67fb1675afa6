"""GPU memory the driver enforces (r615+ / CUDA 13.4): per-cgroup hard and soft limits and MPS v3 namespaces.

Limits go on a leaf cgroup v2 made for the test (`/sys/fs/cgroup/gpupack-gpu-<pid>/<leaf>`, `+dmem` enabled on
the way down) through NVML's nvmlDeviceSetMemoryLimits_v1, as the node side would set them on a container's
own cgroup; the client (cudadrv.py) joins the leaf before CUDA starts. MPS v3 runs as
`nvidia-cuda-mps-control -d -p 3 -m -a <toml>` with memory accounting on and one server, and each namespace
is made with the CLI as the node side makes one per container. Every limit is cleared (soft first) and every
leaf removed after the test. Skips name what the host lacks: a driver older than r615, no cgroup v2 at
/sys/fs/cgroup, NVML refusing limits there, no MPS binary.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuclients import ClientResult, Clients
from gpuhelpers import Report
from gpuhost import (
    CGROUP_ROOT,
    REHEARSAL,
    Leaves,
    LimitError,
    Limits,
    NvmlLimits,
    StandInLimits,
    driver_missing,
    memacct_backend,
    memacct_missing,
)
from gpumps import Daemon

from agent.nvml.base import Nvml
from app.core import names

pytestmark = pytest.mark.gpu

MIB = 1 << 20
SLACK_MIB = 64
SERVER = "gpst"
V3_CONFIG = f"""schema_version = "1.0"

[features.memacct]
enabled = true

[servers.{SERVER}]
"""


@pytest.fixture(scope="session")
def r615(real_nvml: Nvml, report: Report) -> str:
    version = real_nvml.driver_version()
    why = driver_missing(version)
    if why:
        pytest.skip(why)
    report.environment["memacct_driver"] = version
    return version


@pytest.fixture(scope="session")
def cgroup_root(r615: str) -> Path:
    # A rehearsal host may have cgroup v2 only at /sys/fs/cgroup/unified (hybrid): good enough for plumbing.
    root = CGROUP_ROOT
    if REHEARSAL and not (root / "cgroup.controllers").exists():
        root = CGROUP_ROOT / "unified"
    why = memacct_missing(r615, root)
    if why:
        pytest.skip(why)
    return root


@pytest.fixture
def leaves(cgroup_root: Path, report: Report) -> Iterator[Leaves]:
    lv = Leaves(cgroup_root, enable=() if REHEARSAL else ("dmem",))
    why = lv.missing()
    if why:
        pytest.skip(why)
    yield lv
    left = lv.close()
    report.fact("memlimits_cgroups_left", left)
    if lv.notes:
        report.fact("memlimits_subtree_control", lv.notes)
    assert not left, f"cgroups left behind: {left}"


@pytest.fixture
def limits(leaves: Leaves, report: Report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Limits:
    lim: Limits
    if REHEARSAL:
        path = tmp_path / "limits.json"
        monkeypatch.setenv("FAKE_CUDA_LIMITS", str(path))  # the stand-in driver reads it
        lim = StandInLimits(path, leaves)
    else:
        lim = NvmlLimits()
    report.environment["memory_limits_binding"] = lim.binding
    report.environment["memacct_backend"] = memacct_backend(leaves.root)
    return lim


class Limited:
    """Leaves with limits set for one test, cleared (soft first) when it ends."""

    def __init__(self, limits: Limits, uuid: str) -> None:
        self.limits, self.uuid = limits, uuid
        self.set: list[Path] = []

    def on(self, leaf: Path, soft_mib: int, hard_mib: int | None) -> dict[str, int]:
        hard = NvmlLimits.MAX if hard_mib is None else hard_mib * MIB
        try:
            self.limits.set(self.uuid, leaf, soft_mib * MIB, hard)
        except LimitError as exc:
            if exc.unsupported:
                pytest.skip(f"NVML takes no memory limit on {leaf} here: {exc}")
            raise
        self.set.append(leaf)
        return self.limits.get(self.uuid, leaf)

    def clear(self) -> None:
        for leaf in self.set:
            self.limits.clear(self.uuid, leaf)


@pytest.fixture
def limited(limits: Limits, real_nvml: Nvml) -> Iterator[Limited]:
    lim = Limited(limits, real_nvml.uuid(0))
    yield lim
    lim.clear()


@pytest.fixture
def v3(real_nvml: Nvml, mps_binary: str, r615: str, report: Report) -> Iterator[Daemon]:
    d = Daemon(real_nvml, mps_binary, flags=("-p", "3", "-m", "-a", "mps.toml"), adopt=False)
    (d.pipe_dir / "mps.toml").write_text(V3_CONFIG)
    d.flags = ("-p", "3", "-m", "-a", str(d.pipe_dir / "mps.toml"))
    d.start()
    yield d
    report.fact("memlimits_v3_stop_seconds", round(d.stop(), 2))


def namespace(d: Daemon, name: str, thread_pct: int, pinned_mib: int, report: Report) -> Path:
    """A v3 namespace with both limits set (named namespaces inherit nothing); its client pipe dir."""
    said = {}
    for cmd in (
        f"namespace create {name} --server={SERVER}",
        f"namespace set {name} --server={SERVER} --pinned-memory-limit={pinned_mib}M "
        f"--active-thread-percentage={thread_pct}",
    ):
        out = d.control(cmd)
        said[cmd] = {"rc": out.returncode, "said": (out.stdout + out.stderr).strip()[-300:]}
        assert out.returncode == 0, f"{cmd}: {said[cmd]}\n{d.logs()}"
    report.fact(f"v3_namespace_{name}", said)
    return d.pipe_dir / SERVER / name


def _env(uuid: str, pipe: Path | None = None, **extra: str) -> dict[str, str]:
    env = {names.ENV_CUDA_VISIBLE_DEVICES: uuid} | extra
    if pipe is not None:
        env[names.ENV_MPS_PIPE_DIRECTORY] = str(pipe)
    return env


def _ok(r: ClientResult) -> dict[str, object]:
    assert r.rc == 0 and "error" not in r.body, f"client failed (rc {r.rc}): {r.body} {r.stderr[-800:]}"
    return r.body


# --- hard limits ---


@pytest.mark.answers("leaf-total")
@pytest.mark.parametrize(
    "client",
    [
        pytest.param("mps-v3", marks=pytest.mark.answers("hard-oom")),
        pytest.param("plain", marks=pytest.mark.answers("hard-nonmps")),
    ],
)
def test_a_hard_limit_on_the_leaf_stops_allocation_there(
    request: pytest.FixtureRequest,
    real_nvml: Nvml,
    driver: Clients,
    *,
    leaves: Leaves,
    limited: Limited,
    report: Report,
    client: str,
) -> None:
    uuid, total = real_nvml.uuid(0), real_nvml.memory(0).total_mib
    hard = min(4096, total // 4)
    leaf = leaves.leaf(f"hard-{client.replace('-', '')}")
    stored = limited.on(leaf, 0, hard)
    pipe = None
    if client == "mps-v3":
        d: Daemon = request.getfixturevalue("v3")
        pipe = namespace(d, "hardns", 100, total, report)
    body = _ok(driver.run("alloc", ["--cap-mib", str(hard + 4096), "--cgroup", str(leaf)], _env(uuid, pipe)))
    held = not body["capped"] and int(str(body["max_mib"])) <= hard + SLACK_MIB
    total_is_limit = abs(int(str(body["total_mib"])) - hard) <= 1
    evidence = {"hard_mib": hard, "nvml_stored": stored, "client": body}
    qid = "hard-oom" if client == "mps-v3" else "hard-nonmps"
    verdict = "held" if held else "NOT held"
    refusal = body["refusal"] or "none"
    report.answer(
        qid, f"{client}: {verdict} at {hard} MiB (max {body['max_mib']} MiB, refusal {refusal})", **evidence
    )
    report.answer(
        "leaf-total", f"{client}: cuMemGetInfo total {body['total_mib']} MiB, leaf limit {hard}", **evidence
    )
    assert body["cgroup"] == leaves.relative(leaf), "the client did not run in the leaf"
    if client == "mps-v3":
        assert held, f"an MPS v3 client passed its leaf's {hard} MiB hard limit: {body}"
        assert body["refusal"] == "CUDA_ERROR_OUT_OF_MEMORY", body
        assert int(str(body["max_mib"])) >= hard // 2, f"stopped far below the limit: {body}"
        assert total_is_limit, f"cuMemGetInfo total {body['total_mib']} MiB is not the leaf's {hard} MiB"


# --- MPS v3 namespaces ---


@pytest.mark.answers("ns-threads")
def test_a_namespace_thread_percentage_overrides_the_client_env(
    v3: Daemon, driver: Clients, report: Report, real_nvml: Nvml
) -> None:
    uuid, total = real_nvml.uuid(0), real_nvml.memory(0).total_mib
    quarter = namespace(v3, "quarter", 25, total, report)
    whole = namespace(v3, "whole", 100, total, report)
    atp = names.ENV_MPS_THREAD_PERCENTAGE
    seen = {
        "ns 25, env 100": _ok(driver.run("meminfo", [], _env(uuid, quarter, **{atp: "100"}))),
        "ns 100, env 100": _ok(driver.run("meminfo", [], _env(uuid, whole, **{atp: "100"}))),
        "ns 100, env 25": _ok(driver.run("meminfo", [], _env(uuid, whole, **{atp: "25"}))),
    }
    sms = {k: v["context_sm_count"] for k, v in seen.items()}
    full = int(str(seen["ns 100, env 100"]["device_sm_count"]))
    report.answer("ns-threads", f"SMs a context may use (of {full}): {sms}", clients=seen)
    assert sms["ns 100, env 100"] is not None, "cuCtxGetExecAffinity is missing: SMs per context unknown"
    assert sms["ns 100, env 100"] == full, f"a 100 % namespace did not see every SM: {sms}"
    assert int(str(sms["ns 25, env 100"])) <= full * 0.3, f"the env won over the namespace's 25 %: {sms}"


@pytest.mark.answers("malformed-pinned")
def test_a_malformed_pinned_env_does_not_escape_the_cgroup_limit(
    v3: Daemon, driver: Clients, *, leaves: Leaves, limited: Limited, report: Report, real_nvml: Nvml
) -> None:
    uuid, total = real_nvml.uuid(0), real_nvml.memory(0).total_mib
    hard = min(6144, total // 4)
    pinned = hard // 3
    leaf = leaves.leaf("malformed")
    limited.on(leaf, 0, hard)
    pipe = namespace(v3, "malformed", 100, pinned, report)
    # An entry for GPU 1, which this process cannot see: NVIDIA documents that the client then drops every
    # pinned limit, the namespace's too.
    bad = {names.ENV_MPS_MEMORY_LIMIT: "0=1G,1=2G"}
    args = ["--cap-mib", str(hard + 4096), "--cgroup", str(leaf)]
    body = _ok(driver.run("alloc", args, _env(uuid, pipe, **bad)))
    got = int(str(body["max_mib"]))
    report.answer(
        "malformed-pinned",
        f"max {got} MiB: namespace pinned {pinned} MiB {'escaped' if got > pinned + SLACK_MIB else 'held'}, "
        f"cgroup hard {hard} MiB {'held' if got <= hard + SLACK_MIB else 'ESCAPED'}",
        client=body,
    )
    assert got <= hard + SLACK_MIB and not body["capped"], f"the bad env escaped the {hard} MiB limit: {body}"


# --- soft limits ---


@pytest.mark.answers("soft-evict")
def test_an_over_soft_client_is_evicted_for_a_within_soft_one(
    v3: Daemon, driver: Clients, *, leaves: Leaves, limited: Limited, report: Report, real_nvml: Nvml
) -> None:
    if REHEARSAL:
        pytest.skip("rehearsal: the stand-in driver models no eviction")
    uuid, total = real_nvml.uuid(0), real_nvml.memory(0).total_mib
    share = int(total * 0.6)
    greedy, owed = leaves.leaf("oversoft"), leaves.leaf("withinsoft")
    limited.on(greedy, 1024, None)  # guaranteed 1 GiB, will hold 60 %
    limited.on(owed, share, None)  # guaranteed 60 %, will ask for it
    pg = namespace(v3, "greedy", 100, total, report)
    po = namespace(v3, "owed", 100, total, report)
    args = ["--mib", str(share), "--cgroup", str(greedy), "--seconds", "120"]
    holder = driver.start("hold", args, _env(uuid, pg))
    try:
        ready = driver.ready(holder, 60)
        assert ready.get("ready"), f"the over-soft client could not take {share} MiB: {ready}"
        asker = _ok(driver.run("alloc", ["--cap-mib", str(share), "--cgroup", str(owed)], _env(uuid, po)))
    finally:
        held = Clients.release(holder)
    evicted = held.body.get("failure") or held.body.get("cuda_error") or ""
    report.answer(
        "soft-evict",
        f"within-soft client got {asker['max_mib']} of {share} MiB; over-soft: {evicted or 'not evicted'}",
        owed=asker,
        greedy=held.body,
        stored={"greedy": limited.limits.get(uuid, greedy), "owed": limited.limits.get(uuid, owed)},
    )
    assert int(str(asker["max_mib"])) >= share - 1024, f"the within-soft client lacks its share: {asker}"
    assert evicted == "CUDA_ERROR_MPS_CLIENT_TERMINATED", f"the over-soft client was not evicted: {held.body}"


def test_limits_leave_no_cgroup_behind(leaves: Leaves) -> None:
    """The leaves fixture's own promise, checked where no GPU work hides it."""
    leaf = leaves.leaf("empty")
    assert leaf.is_dir() and os.access(leaf / "cgroup.procs", os.W_OK)
