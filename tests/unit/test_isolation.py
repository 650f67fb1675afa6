"""Isolation per GPU: what the agent claims each GPU enforces; placement keeps pods on GPUs that suit them."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from agent.command import gpu_indexes
from agent.loop import Agent, AgentConfig
from agent.mpsdaemon import mpsprep
from agent.mpsdaemon.mps import MpsConfig, MpsSupervisor
from agent.nvml.base import ComputeMode
from agent.report import isolation as iso
from agent.report import reporter as rep
from agent.report.reporter import ReporterConfig
from agent.simgpu.simulated import SimulatedNvml
from app.core import explain, names, request
from app.core.errors import Shortfall
from app.core.isolation import ComputeEnforcement, MemoryEnforcement, Sharing
from app.core.model import Allocation, Demand, Gpu, Node
from app.core.placement import Placement, place, registry
from app.core.placement.fit import headroom, headroom_fits, is_share, node_fits, node_misfit
from app.core.podview import ContainerView, Kind, PodView
from app.core.request import GpuRequest
from app.kube.calls import Request
from app.kube.gpunode import (
    GpuIsolation,
    GPUNode,
    GPUNodeSpec,
    GPUNodeStatus,
    GpuSpec,
    GpuStatus,
    MpsStatus,
)

EXCL, DEFAULT, PROHIBITED = (
    ComputeMode.EXCLUSIVE_PROCESS,
    ComputeMode.DEFAULT,
    ComputeMode.PROHIBITED,
)
M = MemoryEnforcement
MIB = 40_960


# --- what the agent claims (agent.report.isolation.decide) ---


@pytest.mark.parametrize(
    ("mode", "serving", "cap", "cgroup", "want"),
    [
        (EXCL, True, False, False, (Sharing.EXCLUSIVE, M.CLIENT_ENV, ComputeEnforcement.MPS_PERCENTAGE)),
        (EXCL, True, True, False, (Sharing.EXCLUSIVE, M.DAEMON_DEFAULT, ComputeEnforcement.MPS_PERCENTAGE)),
        # DEFAULT: a process may leave MPS by dropping its pipe dir, so the daemon's cap binds nobody.
        (DEFAULT, True, True, False, (Sharing.SHARED, M.CLIENT_ENV, ComputeEnforcement.TIME_SLICE)),
        (None, True, False, False, (Sharing.SHARED, M.CLIENT_ENV, ComputeEnforcement.TIME_SLICE)),
        (DEFAULT, False, True, False, (Sharing.OFF, M.NONE, ComputeEnforcement.TIME_SLICE)),
        (None, False, False, False, (Sharing.OFF, M.NONE, ComputeEnforcement.TIME_SLICE)),
        (EXCL, False, False, False, (Sharing.CLOSED, M.NONE, ComputeEnforcement.TIME_SLICE)),
        (PROHIBITED, True, False, False, (Sharing.CLOSED, M.NONE, ComputeEnforcement.TIME_SLICE)),
        # The driver's per-cgroup limit holds whatever the process does, MPS or not.
        (DEFAULT, False, False, True, (Sharing.OFF, M.PER_CGROUP, ComputeEnforcement.TIME_SLICE)),
        (EXCL, True, True, True, (Sharing.EXCLUSIVE, M.PER_CGROUP, ComputeEnforcement.MPS_PERCENTAGE)),
    ],
)
def test_the_agent_claims_only_what_a_pod_cannot_escape(
    mode: ComputeMode | None,
    serving: bool,
    cap: bool,
    cgroup: bool,
    want: tuple[Sharing, MemoryEnforcement, ComputeEnforcement],
) -> None:
    got = iso.decide(iso.GpuFacts(mode, serving, cap, cgroup, "580.65.06"))
    assert (got.mps_mode, got.memory, got.compute) == want
    assert got.driver_version == "580.65.06"
    assert got.compute_mode == {EXCL: "ExclusiveProcess", DEFAULT: "Default", PROHIBITED: "Prohibited"}.get(
        mode, ""
    )  # type: ignore[call-overload]


def test_the_node_summary_is_its_weakest_gpu() -> None:
    strong = iso.decide(iso.GpuFacts(EXCL, True, True))
    weak = iso.decide(iso.GpuFacts(DEFAULT, True, True))
    assert iso.weakest([strong, weak]) == ("client-env", "time-slice")
    assert iso.weakest([strong, strong]) == ("daemon-default", "mps-percentage")
    assert iso.weakest([]) == ("", "")


# --- what the pod asks (gpupack.io/memory-enforcement) ---


def parse(annotations: dict[str, str]) -> GpuRequest | tuple[object, ...]:
    view = PodView(annotations=annotations, containers=(ContainerView(Kind.REGULAR, 0, "main"),))
    return request.parse(view)


def test_a_pod_requires_a_memory_level_by_annotation() -> None:
    got = parse({names.GPU_FRACTION: "0.5", names.MEMORY_ENFORCEMENT: "daemon-default"})
    assert isinstance(got, GpuRequest)
    assert got.demand().memory_enforcement is M.DAEMON_DEFAULT and not got.demand().timeslice
    plain = parse({names.GPU_FRACTION: "0.5", names.ISOLATION: "none"})
    assert isinstance(plain, GpuRequest)
    assert plain.demand().timeslice and plain.demand().memory_enforcement is M.NONE
    default = parse({names.GPU_FRACTION: "0.5"})
    assert isinstance(default, GpuRequest) and not default.demand().timeslice  # MPS, best effort


@pytest.mark.parametrize(
    ("annotations", "said"),
    [
        (
            {names.MEMORY_ENFORCEMENT: "strict"},
            "gpupack.io/memory-enforcement='strict': must be one of 'none', 'client-env', 'daemon-default', "
            "'per-cgroup' (weakest first): the least a GPU must enforce",
        ),
        (
            {names.MEMORY_ENFORCEMENT: "Per-Cgroup"},
            "gpupack.io/memory-enforcement='Per-Cgroup': must be one of 'none',",
        ),
        (
            {names.MEMORY_ENFORCEMENT: "client-env", names.ISOLATION: "none"},
            "gpupack.io/memory-enforcement='client-env': is an MPS limit, and gpupack.io/isolation: none "
            "makes the pod no MPS client: ask 'per-cgroup', or drop gpupack.io/isolation: none",
        ),
    ],
)
def test_a_bad_level_is_an_error_naming_field_value_and_rule(annotations: dict[str, str], said: str) -> None:
    got = parse({names.GPU_FRACTION: "0.5", **annotations})
    assert isinstance(got, tuple)
    assert any(str(e).startswith(said) for e in got), got


def test_per_cgroup_is_fine_without_mps() -> None:
    got = parse({names.GPU_FRACTION: "0.5", names.ISOLATION: "none", names.MEMORY_ENFORCEMENT: "per-cgroup"})
    assert isinstance(got, GpuRequest) and got.demand().memory_enforcement is M.PER_CGROUP


# --- placement (app.core.placement.fit) ---


def gpu(i: int, sharing: Sharing, memory: MemoryEnforcement = M.NONE, milli: int = 0) -> Gpu:
    used = milli * MIB // 1000
    return Gpu(i, "A100-40GB", MIB, f"GPU-{i}", milli, used, sharing=sharing, memory_enforcement=memory)


def node(*gpus: Gpu, mps: bool = True) -> Node:
    return Node("n1", tuple(gpus), mps=mps, mps_reason="" if mps else "MPS is starting on this node")


HALF = Demand(1, 500)
HALF_NONE = Demand(1, 500, timeslice=True)


def test_isolation_none_pods_stay_off_exclusive_gpus_and_say_why() -> None:
    exclusive = node(gpu(0, Sharing.EXCLUSIVE, M.CLIENT_ENV), gpu(1, Sharing.EXCLUSIVE, M.CLIENT_ENV))
    reason = node_misfit(exclusive, HALF_NONE)
    assert reason is not None and reason.shortfall is Shortfall.ISOLATION
    assert reason.rule == (
        "pod asks gpupack.io/isolation=none (time-slicing), but GPU 0, 1 are in EXCLUSIVE_PROCESS for MPS "
        "(sharing 'exclusive'), which refuses a process outside MPS"
    )
    assert node_misfit(exclusive, HALF) is None  # an MPS pod (explicit or by default) fits
    for sharing in (Sharing.SHARED, Sharing.OFF, Sharing.UNKNOWN):
        assert node_misfit(node(gpu(0, sharing)), HALF_NONE) is None, sharing


def test_a_node_with_both_modes_puts_each_pod_on_a_gpu_of_its_mode() -> None:
    mixed = node(gpu(0, Sharing.EXCLUSIVE, M.CLIENT_ENV), gpu(1, Sharing.SHARED, M.CLIENT_ENV, milli=400))
    for name in ("binpack", "spread", "fgd", "fragaware"):
        got = place([mixed], HALF_NONE, registry.create(name))
        assert isinstance(got, Placement) and got.gpus == (1,), name
        # Two GPUs asked, one suits: refused, with how many suit.
        reason = node_misfit(mixed, Demand(2, 300, timeslice=True))
        assert reason is not None and reason.rule.endswith("(it needs 2 GPUs; 1 suits it)")


def test_a_closed_gpu_takes_no_share_of_any_kind() -> None:
    closed = node(gpu(0, Sharing.CLOSED), mps=False)
    for demand in (HALF, HALF_NONE, Demand(1, memory_mib=1024)):
        reason = node_misfit(closed, demand)
        assert reason is not None
        assert "GPU 0 in EXCLUSIVE_PROCESS with no MPS daemon serving it" in reason.rule
    assert headroom(closed).caps == (-1,) and not headroom_fits(headroom(closed), HALF)


def test_a_required_memory_level_is_refused_below_it_naming_both() -> None:
    want = Demand(1, 500, memory_enforcement=M.PER_CGROUP)
    weak = node(gpu(0, Sharing.EXCLUSIVE, M.DAEMON_DEFAULT), gpu(1, Sharing.SHARED, M.CLIENT_ENV))
    reason = node_misfit(weak, want)
    assert reason is not None and reason.shortfall is Shortfall.ISOLATION
    assert reason.rule == (
        "pod requires GPU memory enforcement 'per-cgroup' (gpupack.io/memory-enforcement), but this node's "
        "GPUs give at most 'daemon-default'"
    )
    assert node_misfit(weak, replace(want, memory_enforcement=M.DAEMON_DEFAULT)) is None
    got = place([weak], replace(want, memory_enforcement=M.DAEMON_DEFAULT), registry.create("binpack"))
    assert isinstance(got, Placement) and got.gpus == (0,)
    # Two GPUs wanted, one meets the level: the other is named with what it gives.
    reason = node_misfit(weak, Demand(2, 300, memory_enforcement=M.DAEMON_DEFAULT))
    assert reason is not None and reason.rule == (
        "pod requires GPU memory enforcement 'daemon-default' (gpupack.io/memory-enforcement), but GPU 1 "
        "gives at most 'client-env' (it needs 2 GPUs; 1 suits it)"
    )
    # A GPU that reports nothing (an agent from before levels) gives none: a requirement is not met there.
    assert node_misfit(node(gpu(0, Sharing.UNKNOWN)), replace(want, memory_enforcement=M.CLIENT_ENV))


def test_a_mig_device_meets_every_memory_level() -> None:
    mig = Gpu(100, "A100-40GB", 10_240, "MIG-1", mig_profile="1g.10gb", parent=0)
    want = Demand(1, memory_mib=10_240, mig=True, memory_enforcement=M.PER_CGROUP)
    assert node_fits(Node("n1", (mig,)), want)


def random_gpu(rng: random.Random, i: int) -> Gpu:
    return gpu(
        i,
        rng.choice(list(Sharing)),
        rng.choice(list(MemoryEnforcement)),
        milli=rng.choice((0, 0, 250, 500, 700, 1000)),
    )


DEMANDS = (
    HALF,
    HALF_NONE,
    Demand(2, 400),
    Demand(1, memory_mib=8192),
    Demand(1, 250, memory_enforcement=M.CLIENT_ENV),
    Demand(2, 500, timeslice=True, memory_enforcement=M.PER_CGROUP),
    Demand(1, 300, needs_mps=True),
)


def test_the_fast_paths_agree_with_the_rule_on_random_modes() -> None:
    """headroom (the simulator's replay) and the policy's array form (the engine's many-node pass) answer
    as node_fits and the policy's filter do, wherever they answer, on nodes of every mode and level."""
    rng = random.Random(7)
    nodes = [
        replace(node(*(random_gpu(rng, i) for i in range(rng.choice((1, 2, 4))))), name=f"n{k}")
        for k in range(300)
    ]
    policy = registry.create("fragaware")
    form = registry.array_form(policy)
    assert form is not None
    for demand in DEMANDS:
        judged = form.judge(nodes, [form.read(n) for n in nodes], demand)
        for n, answer in zip(nodes, judged, strict=True):
            if is_share(demand):
                assert headroom_fits(headroom(n), demand) == node_fits(n, demand), (n, demand)
            if answer is None:
                continue
            reason = policy.filter(n, demand)
            assert answer == (reason if reason is not None else policy.score(n, demand)), (n, demand)
        if not form.covers(demand):
            assert judged == [None] * len(nodes)
    # Only demands without an isolation need take the fast paths.
    assert not is_share(HALF_NONE) and not form.covers(HALF_NONE)
    assert is_share(HALF) and form.covers(HALF)


# --- the GPUNode carries it to placement ---


def gpunode(isolation: GpuIsolation | None) -> GPUNode:
    spec = GPUNodeSpec(
        node_name="n1",
        driver_version="580.65.06",
        gpus=(GpuSpec(uuid="GPU-0", index=0, model="A100-40GB", memory_mib=MIB, mps_capable=True),),
    )
    status = GPUNodeStatus(
        heartbeat_time=1.0,
        gpus=(GpuStatus(uuid="GPU-0", index=0, healthy=True, isolation=isolation),),
        mps=MpsStatus(state="running", isolation="mps"),
    )
    return GPUNode.of("n1", spec, status)


def test_placement_reads_each_gpus_mode_and_level_from_the_gpunode() -> None:
    reported = iso.decide(iso.GpuFacts(EXCL, True, True, driver_version="580.65.06"))
    model = gpunode(reported).to_model_node().gpus[0]
    assert (model.sharing, model.memory_enforcement) == (Sharing.EXCLUSIVE, M.DAEMON_DEFAULT)
    wire = gpunode(reported).wire()["status"]["gpus"][0]["isolation"]
    assert wire == {
        "driverVersion": "580.65.06",
        "computeMode": "ExclusiveProcess",
        "mpsMode": "exclusive",
        "memory": "daemon-default",
        "compute": "mps-percentage",
    }
    old = gpunode(None).to_model_node().gpus[0]  # an agent from before: unknown mode, no level claimed
    assert (old.sharing, old.memory_enforcement) == (Sharing.UNKNOWN, M.NONE)


# --- explain ---


def test_explain_names_each_gpus_mode_and_why_it_does_not_suit() -> None:
    mixed = node(gpu(0, Sharing.EXCLUSIVE, M.CLIENT_ENV), gpu(1, Sharing.SHARED, M.CLIENT_ENV, milli=400))
    doc = explain.explain({"n1": mixed}, HALF_NONE, registry.create("binpack"))
    rows = doc["nodes"][0]["gpus"]
    assert rows[0]["fits"] is False and "EXCLUSIVE_PROCESS" in rows[0]["reason"]
    assert rows[0]["mpsMode"] == "exclusive" and rows[0]["memoryEnforcement"] == "client-env"
    assert rows[1]["fits"] is True
    assert doc["demand"]["timeSlice"] is True and doc["choice"] == {"node": "n1", "gpus": [1]}


# --- a GPU busy when the daemon pod started: reported as it is, switched once idle ---


def test_a_gpu_busy_at_the_daemons_start_is_placed_by_its_actual_mode_until_switched(tmp_path: Path) -> None:
    """The agent (simulated NVML as root, the stand-in MPS daemon) keeps MPS GPUs in EXCLUSIVE_PROCESS:
    GPU 1 has a process when the daemon pod's init runs, so it stays DEFAULT and is reported "shared";
    placement then puts an `isolation: none` pod there only. Once idle, the agent switches it, the ready
    record follows, and the GPUNode says "exclusive" (a change worth a scheduler retry)."""
    busy = [{"pid": 4242, "used_mib": 100}]
    nvml, pipe = prepared_for_mps(
        tmp_path, [{"model": "A100-40GB"}, {"model": "A100-40GB", "processes": busy}]
    )
    sim_file = tmp_path / "gpus.yaml"  # rewritten below: GPU 1 goes idle
    mps_config = MpsConfig(binary=str(STANDIN), pipe_dir=pipe, command_timeout_s=20)
    start_standin(pipe)
    try:
        clock = Clock()
        agent = exclusive_agent(nvml, mps_config, clock=clock, facts=iso.NodeFacts(daemon_memory_cap=True))
        first = agent.step()
        assert [g.isolation.mps_mode for g in first.gpus if g.isolation] == ["exclusive", "shared"]
        assert first.summary.memory_enforcement == "client-env"  # the weakest GPU's
        assert first.summary.mps_modes == "exclusive,shared"  # `kubectl get gpunodes`' GPU-Modes
        spec = rep.build_spec("n1", agent.sampler.sample(), True)
        before = GPUNode.of("n1", spec, first).to_model_node()
        got = place([before], HALF_NONE, registry.create("fragaware"))
        assert isinstance(got, Placement) and got.gpus == (1,)
        # Its MPS pods are not refused by the node side either (agent.mpsdaemon.mpsprep.readiness).
        assert mpsprep.readiness(pipe, mpsprep.boot_id())([nvml.uuid(1)]) == ""

        write_yaml(sim_file, {"gpus": [{"model": "A100-40GB"}, {"model": "A100-40GB"}]})  # it went idle
        clock.now += 31
        after = agent.step()
        assert [g.isolation.mps_mode for g in after.gpus if g.isolation] == ["exclusive", "exclusive"]
        assert after.gpus[1].isolation and after.gpus[1].isolation.memory == "daemon-default"
        assert rep.significant_change(first, after, 256) == "GPU 1 processes"
        assert rep.capacity_grew(first, after, 256, 90) == "GPU 1 isolation"  # the Node is nudged
        record = json.loads((pipe / mpsprep.READY_FILE).read_text())
        assert set(record["gpus"].values()) == {EXCL.value}
        reason = node_misfit(GPUNode.of("n1", spec, after).to_model_node(), HALF_NONE)
        assert reason is not None and "GPU 0, 1 are in EXCLUSIVE_PROCESS" in reason.rule
    finally:
        stop_standin(pipe)


STANDIN = Path(__file__).resolve().parents[1] / "standin" / "mps_control.py"


class Clock:
    now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def write_yaml(path: Path, doc: object) -> None:
    path.write_text(yaml.safe_dump(doc))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # the simulator re-reads on mtime


def standin(pipe: Path, *args: str, command: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(pipe))
    return subprocess.run(
        [sys.executable, str(STANDIN), *args], input=command, env=env, capture_output=True, text=True,
        timeout=20, check=False,
    )  # fmt: skip


def prepared_for_mps(tmp_path: Path, gpus: list[dict[str, object]]) -> tuple[SimulatedNvml, Path]:
    """Simulated `gpus` (their file: tmp_path/gpus.yaml) as the MPS daemon pod's init leaves them: in
    EXCLUSIVE_PROCESS where idle, its ready record written in the pipe directory (returned) for this boot."""
    sim_file = tmp_path / "gpus.yaml"
    write_yaml(sim_file, {"gpus": gpus})
    nvml = SimulatedNvml(sim_file, "n1", state_dir=tmp_path / "driver", privileged=True)
    pipe = tmp_path / "pipe"
    nvml.init()
    mpsprep.write_ready(pipe, mpsprep.apply(nvml, EXCL), mpsprep.boot_id())
    return nvml, pipe


def exclusive_agent(
    nvml: SimulatedNvml,
    mps: MpsConfig,
    *,
    clock: Clock,
    send: Callable[[Request], dict[str, object]] = lambda _req: {},
    facts: iso.NodeFacts | None = None,
) -> Agent:
    """An agent whose MPS GPUs go to EXCLUSIVE_PROCESS, with the stand-in daemon as `mps` configures it."""
    config = AgentConfig(
        "n1",
        ReporterConfig(heartbeat_s=30, min_interval_s=5, memory_threshold_mib=256),
        mps_compute_mode=EXCL,
    )
    if facts is not None:
        config = replace(config, isolation=facts)
    return Agent(config, nvml=nvml, resolver=nvml, mps=MpsSupervisor(mps), send=send, clock=clock)


def start_standin(pipe: Path) -> None:
    done = standin(pipe, "-d", "-M")
    assert done.returncode == 0, done.stderr


def stop_standin(pipe: Path) -> None:
    standin(pipe, command="quit\n")
    deadline = time.monotonic() + 5
    while (pipe / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_time_slice_gpus_stay_in_default_beside_exclusive_ones(tmp_path: Path) -> None:
    """agent.mps.timeSliceGpus: those GPUs are kept in DEFAULT (switched back once idle if they were
    EXCLUSIVE_PROCESS), the others go EXCLUSIVE_PROCESS; with the daemon serving, one node then offers
    both modes and each pod gets a GPU of its own."""
    sim_file = tmp_path / "gpus.yaml"
    write_yaml(sim_file, {"gpus": [{"model": "T4"}, {"model": "T4", "compute_mode": EXCL.value}]})
    nvml = SimulatedNvml(sim_file, "n1", state_dir=tmp_path / "driver", privileged=True)
    nvml.init()
    modes = mpsprep.apply(nvml, EXCL, (1,))
    assert [(m.mode, m.switched) for m in modes] == [(EXCL, True), (DEFAULT, True)]
    assert [m.switched for m in mpsprep.apply(nvml, EXCL, (1,))] == [False, False]
    assert [m.mode for m in mpsprep.apply(nvml, None, (1,))] == [EXCL, DEFAULT]  # keep: nothing switched
    got = [iso.decide(iso.GpuFacts(m.mode, True)).mps_mode for m in modes]
    assert got == [Sharing.EXCLUSIVE, Sharing.SHARED]


@pytest.mark.parametrize(("raw", "want"), [("1,3", (1, 3)), ("3, 1,1", (1, 3)), ("none", ()), ("", ())])
def test_time_slice_gpus_flag(raw: str, want: tuple[int, ...]) -> None:
    assert gpu_indexes(raw) == want


@pytest.mark.parametrize("raw", ["-1", "a,b", "1;2"])
def test_a_bad_time_slice_gpus_flag_names_the_value_and_rule(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as bad:
        gpu_indexes(raw)
    assert str(bad.value) == f"{raw!r}: must be GPU indexes separated by commas, like 1,3"


@pytest.mark.parametrize(
    ("node_side_limits", "driver", "memory"),
    [
        (True, "615.25", MemoryEnforcement.PER_CGROUP),
        (True, "580.95.05", MemoryEnforcement.CLIENT_ENV),  # the node side is ready, the driver is not
        (False, "615.25", MemoryEnforcement.CLIENT_ENV),  # no node side: nothing sets the limits
    ],
)
def test_per_cgroup_memory_is_claimed_only_where_the_node_side_sets_it_and_the_driver_takes_it(
    node_side_limits: bool, driver: str, memory: MemoryEnforcement
) -> None:
    facts = iso.NodeFacts(per_cgroup_memory=node_side_limits).of(ComputeMode.EXCLUSIVE_PROCESS, True, driver)
    assert iso.decide(facts).memory is memory


def test_the_agent_offers_per_cgroup_limits_only_with_its_node_socket(tmp_path: Path) -> None:
    from agent.main import build
    from agent.settings import Settings

    sim = tmp_path / "gpus.yaml"
    sim.write_text(yaml.safe_dump({"driver_version": "615.25", "gpus": [{"model": "T4"}]}))
    common = {"node": "n1", "sim": sim, "sim_state": tmp_path / "state", "mps": False}
    without = build(Settings(**common), lambda r: {}, time.monotonic, None)  # type: ignore[arg-type]
    assert without.config.isolation.per_cgroup_memory is False
    with_socket = Settings(**common, node_socket=tmp_path / "agent.sock")  # type: ignore[arg-type]
    root = Path("/sys/fs/cgroup")
    expected = (root / "cgroup.controllers").exists() or (root / "unified" / "cgroup.controllers").exists()
    assert (
        build(with_socket, lambda r: {}, time.monotonic, None).config.isolation.per_cgroup_memory is expected
    )


def test_an_exclusive_process_gpu_is_claimed_exclusive_only_while_a_server_runs(tmp_path: Path) -> None:
    """Measured (docs/node-side.md, "MPS as measured"): EXCLUSIVE_PROCESS refuses a plain process only while
    an MPS server runs. A daemon with no server (here one the agent does not pre-start a server on) leaves
    the GPU open to the first plain process, so the GPUNode says `closed` (no new share), not `exclusive`,
    until the daemon lists a server; then `exclusive` in the same cycle."""
    nvml, pipe = prepared_for_mps(tmp_path, [{"model": "A100-40GB"}])
    start_standin(pipe)
    try:
        agent = exclusive_agent(
            nvml, MpsConfig(binary=str(STANDIN), pipe_dir=pipe, prestart_server=False), clock=Clock()
        )
        first = agent.step()
        assert first.mps.state == "running" and standin(pipe, command="get_server_list\n").stdout == ""
        assert [g.isolation.mps_mode for g in first.gpus if g.isolation] == ["closed"]
        assert standin(pipe, command="start_server -uid 0\n").returncode == 0  # e.g. a client came
        after = agent.step()
        assert [g.isolation.mps_mode for g in after.gpus if g.isolation] == ["exclusive"]
    finally:
        stop_standin(pipe)


def test_a_gpu_holding_an_isolation_none_share_is_not_switched_while_idle(tmp_path: Path) -> None:
    """With EXCLUSIVE_PROCESS the default, an upgrade or a busy start can leave an `isolation: none` share on
    a DEFAULT GPU. Between its processes that GPU is idle; switched then, the pod's next process would be
    refused (a server runs). It stays DEFAULT while the share is there, and is switched once it is gone."""
    sim_file = tmp_path / "gpus.yaml"
    write_yaml(sim_file, {"gpus": [{"model": "A100-40GB"}, {"model": "A100-40GB"}]})
    nvml = SimulatedNvml(sim_file, "n1", state_dir=tmp_path / "driver", privileged=True)
    nvml.init()
    alloc = Allocation("n1", (0,), (nvml.uuid(0),), 500, 20480)
    asked = {names.GPU_FRACTION: "0.5", names.ISOLATION: "none", **alloc.to_annotations()}
    pod = {
        "metadata": {"uid": "u-none", "namespace": "ml", "name": "plain",
                     "labels": {names.LABEL_MANAGED: "true"}, "annotations": asked},
        "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    pods = [pod]

    def send(req: Request) -> dict[str, object]:
        return {"items": pods} if req.method == "GET" and req.path == "/api/v1/pods" else {}

    clock = Clock()
    agent = exclusive_agent(
        nvml, MpsConfig(binary=str(STANDIN), pipe_dir=tmp_path / "pipe"), clock=clock, send=send
    )  # no daemon runs
    for _ in range(2):
        agent.step()
        clock.now += 31
    assert [nvml.compute_mode(i) for i in (0, 1)] == [DEFAULT, EXCL]
    pods.clear()  # the share has gone
    for _ in range(3):
        agent.step()
        clock.now += 31
    assert [nvml.compute_mode(i) for i in (0, 1)] == [EXCL, EXCL]


def test_a_server_started_before_the_daemons_memory_cap_gives_no_daemon_default_claim(tmp_path: Path) -> None:
    """An agent that adds a daemon-wide memory cap (agent.mps.defaultPinnedMemoryLimitMiB) to a daemon whose
    server already runs: that server keeps running without the cap, so the GPU claims `client-env` memory, not
    `daemon-default`, until the server has been replaced."""
    nvml, pipe = prepared_for_mps(tmp_path, [{"model": "A100-40GB"}])
    start_standin(pipe)
    try:
        assert standin(pipe, command="start_server -uid 0\n").returncode == 0  # an earlier agent's server
        (server,) = standin(pipe, command="get_server_list\n").stdout.split()
        clock = Clock()
        agent = exclusive_agent(
            nvml,
            MpsConfig(
                binary=str(STANDIN),
                pipe_dir=pipe,
                default_pinned_mem_limit_mib=8192,
                command_timeout_s=20,
            ),
            clock=clock,
            facts=iso.NodeFacts(daemon_memory_cap=True),
        )
        first = agent.step()
        assert first.mps.state == "running" and server in first.mps.message
        assert [(g.isolation.mps_mode, g.isolation.memory) for g in first.gpus if g.isolation] == [
            ("exclusive", M.CLIENT_ENV)
        ]
        assert standin(pipe, command=f"shutdown_server {server} -f\n").returncode == 0
        clock.now += 5
        after = agent.step()  # a new server, started with the cap
        assert [(g.isolation.mps_mode, g.isolation.memory) for g in after.gpus if g.isolation] == [
            ("exclusive", M.DAEMON_DEFAULT)
        ]
    finally:
        stop_standin(pipe)


def test_a_gpu_with_room_held_only_by_its_mode_is_the_reason_not_the_others_room() -> None:
    """While the MPS daemon is down, an MPS GPU is `closed`: a new MPS pod that would fit there is told so,
    not that the node's other (full) GPU lacks room."""
    down = node(gpu(0, Sharing.CLOSED, milli=500), gpu(1, Sharing.SHARED, M.CLIENT_ENV, milli=1000))
    reason = node_misfit(down, HALF)
    assert reason is not None and reason.shortfall is Shortfall.ISOLATION, reason
    assert "GPU 0 in EXCLUSIVE_PROCESS with no MPS daemon serving it (sharing 'closed')" in reason.rule
    # No room anywhere: the room is the reason.
    full = node(gpu(0, Sharing.CLOSED, milli=1000), gpu(1, Sharing.SHARED, M.CLIENT_ENV, milli=1000))
    reason = node_misfit(full, HALF)
    assert reason is not None and reason.shortfall is Shortfall.GPU_SHARE
