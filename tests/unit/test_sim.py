"""The trace simulator: loader errors, hand-checked outcomes, the fast path against `place`, the CLI."""

from __future__ import annotations

import io
import json
import math
import random
from pathlib import Path

import pytest

from app.cli import main
from app.core.model import Demand, Node
from app.core.placement import Placement, TargetWorkload, place, registry
from app.tools.sim import command
from app.tools.sim.engine import Cluster, arrival_sequence, chooser, simulate
from app.tools.sim.loader import TraceError, TracePod, load_nodes, load_pods, read_nodes, read_pods

FIXTURES = Path(__file__).parent / "fixtures" / "sim"
NODES = FIXTURES / "tiny_nodes.csv"
PODS = FIXTURES / "tiny_pods.csv"


def synthetic() -> tuple[tuple[Node, ...], tuple[TracePod, ...], TargetWorkload]:
    nodes, pods, _ = command.load_trace(None, None)
    return nodes, pods, TargetWorkload.from_demands(p.demand for p in pods)


# --- loader ---------------------------------------------------------------------------------------------


def test_loader_reads_the_tiny_fixture() -> None:
    nodes = load_nodes(NODES)
    pods = load_pods(PODS)
    assert [(n.name, len(n.gpus), n.model, n.gpus[0].memory_mib, n.cpu_milli_free) for n in nodes] == [
        ("node-a", 1, "T4", 15109, 8000),
        ("node-b", 1, "T4", 15109, 8000),
    ]
    assert len(pods) == 4
    assert pods[0].demand.milli == 650
    assert pods[0].gpu_milli == 650


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1x,0,1,500\n",
            "pods.csv:2: column cpu_milli='1x': must be an integer in [0, 1099511627776]",
            id="not-integer",
        ),
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,0,1,500\nq,1,0,1,1500\n",
            "pods.csv:3: column gpu_milli='1500': must be an integer in [0, 1000]",
            id="milli-too-big",
        ),
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,0,2,0\n",
            "pods.csv:2: column gpu_milli='0': must be in [1, 1000] when num_gpu > 0",
            id="gpus-without-milli",
        ),
        pytest.param(
            "name,cpu_milli,num_gpu,gpu_milli\np,1,1,500\n",
            "pods.csv:1: header='name,cpu_milli,num_gpu,gpu_milli': must have the column(s) memory_mib",
            id="missing-column",
        ),
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,0,1\n",
            "pods.csv:2: row='p,1,0,1': must have 5 columns, as the header does",
            id="short-row",
        ),
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n",
            "pods.csv: rows=0: must list at least one pod",
            id="empty",
        ),
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n,1,0,1,500\n",
            "pods.csv:2: column name='': must not be empty",
            id="no-name",
        ),
    ],
)
def test_pod_loader_errors_name_file_line_and_column(text: str, message: str) -> None:
    with pytest.raises(TraceError) as err:
        read_pods(io.StringIO(text), "pods.csv")
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "sn,cpu_milli,memory_mib,gpu,model\nn1,1000,1000,2,B200X\n",
            "nodes.csv:2: column model='B200X': must be a known GPU model (",
            id="unknown-model",
        ),
        pytest.param(
            "sn,cpu_milli,memory_mib,gpu,model\nn1,1000,1000,1,T4\nn1,1000,1000,1,T4\n",
            "nodes.csv:3: column sn='n1': must be unique",
            id="duplicate",
        ),
        pytest.param(
            "sn,cpu_milli,memory_mib,gpu,model\nn1,1000,1000,-1,T4\n",
            "nodes.csv:2: column gpu='-1': must be an integer in [0, 64]",
            id="negative-gpus",
        ),
    ],
)
def test_node_loader_errors_name_file_line_and_column(text: str, message: str) -> None:
    with pytest.raises(TraceError) as err:
        read_nodes(io.StringIO(text), "nodes.csv")
    assert str(err.value).startswith(message)


def test_loader_reports_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(
        TraceError, match=r"^file='.*/nope\.csv': must be readable \(No such file or directory\)$"
    ):
        load_pods(tmp_path / "nope.csv")


# --- engine ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["binpack", "spread", "fgd", "fragaware"])
def test_tiny_trace_allocation_matches_hand_computation(name: str) -> None:
    # Two 1-GPU nodes, four 650-milli pods (= 130 % of capacity, so no inflation): whatever the order,
    # each GPU takes exactly one pod, so 1300 of 2000 milli end up allocated and two pods fail.
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    wl = TargetWorkload.from_demands(p.demand for p in pods)
    result = simulate(nodes, pods, registry.create(name, wl), wl, seed=1, inflate=1.3)
    assert (result.pods, result.placed, result.failed) == (4, 2, 2)
    assert result.alloc_pct[130] == pytest.approx(65.0)
    assert result.unallocated_at(130) == pytest.approx(35.0)
    # the first pod always fits: arrived 32.5 % rounds to bin 32 with 32.5 % allocated
    assert result.alloc_pct[32] == pytest.approx(32.5)


def test_arrival_sequence_inflates_with_copies_and_is_seeded() -> None:
    pods = load_pods(PODS)
    seq, order = arrival_sequence(pods, nodes=2, capacity_milli=1000, seed=3, inflate=3.0)
    assert sorted(p.name for p in seq[:4]) == [p.name for p in pods]
    assert len(seq) == 4  # 4 x 650 = 2600 < 3000, but one more copy would pass 3000
    seq2, order2 = arrival_sequence(pods, nodes=2, capacity_milli=1000, seed=3, inflate=3.0)
    assert (seq, order) == (seq2, order2)
    seq3, _ = arrival_sequence(pods, nodes=2, capacity_milli=1000, seed=3, inflate=5.0)
    assert len(seq3) == 7 and sum(p.gpu_milli for p in seq3) <= 5000


def test_arrival_sequence_drops_pods_above_the_target() -> None:
    seq, _ = arrival_sequence(load_pods(PODS), nodes=2, capacity_milli=1000, seed=3, inflate=1.3)
    assert len(seq) == 2  # 1300 / 650


@pytest.mark.parametrize("name", ["binpack", "spread", "fragaware"])
def test_fast_path_decides_exactly_like_place(name: str) -> None:
    nodes, pods, wl = synthetic()
    fast = simulate(nodes, pods, registry.create(name, wl), wl, seed=42)
    slow = simulate(nodes, pods, registry.create(name, wl), wl, seed=42, indexed=False)
    assert (fast.placed, fast.failed) == (slow.placed, slow.failed)
    assert fast.alloc_pct == pytest.approx(slow.alloc_pct, nan_ok=True)
    assert fast.frag_pct == pytest.approx(slow.frag_pct, nan_ok=True)


def test_synthetic_run_is_deterministic_and_consistent() -> None:
    nodes, pods, wl = synthetic()
    runs = [simulate(nodes, pods, registry.create("fragaware", wl), wl, seed=s) for s in (42, 42, 43)]
    assert runs[0].alloc_pct == runs[1].alloc_pct
    assert runs[0].alloc_pct != runs[2].alloc_pct
    r = runs[0]
    assert r.placed + r.failed == r.pods
    real = [a for a in r.alloc_pct if not math.isnan(a)]
    assert real == sorted(real)  # nothing departs, so allocation never drops
    # a bin holds rows with arrived in [x - 0.5, x + 0.5); an empty one borrows its neighbours
    assert all(a <= x + 1.5 for x, a in enumerate(r.alloc_pct) if not math.isnan(a))
    assert 80 < r.alloc_pct[130] <= 100


# --- CLI ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["--seeds", "51-42"], "--seeds='51-42': must be N, A-B with A <= B", id="seeds-reversed"
        ),
        pytest.param(["--seeds", "x"], "--seeds='x': must be N, A-B with A <= B", id="seeds-text"),
        pytest.param(["--policy", "best"], "--policy='best': must be one of ", id="policy"),
        pytest.param(
            ["--inflate", "-1"], "--inflate='-1': must be a decimal number in (0, 10]", id="inflate"
        ),
        pytest.param(
            ["--nodes", "missing.csv", "--pods", "x"], "--nodes='missing.csv': must be an existing", id="file"
        ),
        pytest.param(
            ["--nodes", str(NODES)], "--pods='': is required together with --nodes", id="pods-missing"
        ),
        pytest.param(["--jobs", "0"], "--jobs='0': must be a whole number from 1 to 999", id="jobs"),
    ],
)
def test_cli_rejects_bad_input_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"gpupack simulate: {message}")


def test_cli_reports_a_bad_trace_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "pods.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,0,1,abc\n")
    assert main(["simulate", "--nodes", str(NODES), "--pods", str(bad)]) == 2
    assert (
        capsys.readouterr().err
        == f"gpupack simulate: {bad}:2: column gpu_milli='abc': must be an integer in [0, 1000]\n"
    )


def test_cli_runs_the_tiny_trace_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    argv = ["simulate", "--nodes", str(NODES), "--pods", str(PODS), "--seeds", "1-3", "--json", str(out)]
    assert main([*argv, "--policy", "binpack", "--policy", "fragaware"]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"binpack", "fragaware"}
    for numbers in doc["policies"].values():
        assert numbers["unallocated_pct_at_130"] == pytest.approx(35.0)
        assert numbers["seeds"] == [1, 2, 3]
    table = capsys.readouterr().out
    assert "unalloc@100" in table and "binpack" in table


def test_cli_default_is_the_builtin_synthetic_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "p.png"
    assert main(["simulate", "--seeds", "42", "--policy", "fragaware", "--plot", str(plot)]) == 0
    assert "built-in synthetic trace: 40 nodes, 164 GPUs" in capsys.readouterr().out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_in_parallel_give_exactly_the_serial_results(tmp_path: Path) -> None:
    outs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}.json"
        argv = ["simulate", "--seeds", "42-43", "--policy", "fgd", "--policy", "spread", "--jobs", jobs]
        assert main([*argv, "--json", str(out)]) == 0
        doc = json.loads(out.read_text())
        for numbers in doc["policies"].values():
            numbers.pop("pods_per_second", None)  # wall-clock, the one field allowed to differ
        outs.append(doc)
    assert outs[0] == outs[1]


@pytest.mark.parametrize("name", ["binpack", "spread", "fgd", "fragaware"])
def test_the_chooser_agrees_with_place_while_pods_arrive_and_leave(name: str) -> None:
    """Departures give nodes room back: the chooser must judge them again, never trust an old bound."""
    nodes, pods, wl = synthetic()
    rng = random.Random(name)
    policy = registry.create(name, wl)
    cluster = Cluster(list(nodes), wl)
    engine = chooser(cluster, policy)
    running: list[tuple[int, Demand, tuple[int, ...]]] = []
    placed = 0
    for _ in range(1500):
        if running and rng.random() < 0.35:
            i, demand, gpus = running.pop(rng.randrange(len(running)))
            cluster.release(i, demand, gpus)
            engine.set(i, cluster.nodes[i])
            continue
        demand = rng.choice(pods).demand
        expected = place(cluster.nodes, demand, policy)
        i = engine.choose(demand)
        if not isinstance(expected, Placement):
            assert i is None
            continue
        assert i is not None and cluster.nodes[i] is expected.node
        assert engine.gpus(i, demand) == expected.gpus
        cluster.apply(i, demand, expected.gpus)
        engine.set(i, cluster.nodes[i])
        running.append((i, demand, expected.gpus))
        placed += 1
    assert placed > 500 and len(running) < placed  # both arrivals and departures happened


@pytest.mark.parametrize(
    ("nodes", "pods", "message"),
    [
        pytest.param(
            "sn,cpu_milli,memory_mib,gpu,model\nn1,1000,1000,0,\n",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,0,1,500\n",
            "--nodes='{nodes}': must list at least one node with GPUs (column gpu > 0)",
            id="no-gpu-nodes",
        ),
        pytest.param(
            "sn,cpu_milli,memory_mib,gpu,model\nn1,1000,1000,1,T4\n",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,0,0,0\n",
            "--pods='{pods}': must list at least one pod that asks for a GPU (column num_gpu > 0)",
            id="no-gpu-pods",
        ),
    ],
)
def test_a_trace_with_nothing_to_replay_is_a_usage_error_not_a_crash(
    nodes: str, pods: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: a traceback (no GPU capacity) or a table of nan (no GPU pods).
    node_file, pod_file = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    node_file.write_text(nodes)
    pod_file.write_text(pods)
    assert main(["simulate", "--nodes", str(node_file), "--pods", str(pod_file), "--jobs", "1"]) == 2
    want = message.format(nodes=node_file, pods=pod_file)
    assert capsys.readouterr().err == f"gpupack simulate: {want}\n"


def test_every_input_error_of_the_simulator_has_the_one_shape() -> None:
    # Flags and trace files alike: [where: ]field=value: rule, the value in Python notation.
    from app.core.errors import FieldError, InputError
    from app.tools.sim.command import UsageError, parse_seeds

    with pytest.raises(UsageError) as usage:
        parse_seeds("9-1")
    with pytest.raises(TraceError) as trace:
        read_pods(io.StringIO("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,0,1,abc\n"), "pods.csv")
    for exc in (usage.value, trace.value):
        assert isinstance(exc, InputError) and len(exc.errors) == 1
    assert usage.value.errors[0] == FieldError("--seeds", "9-1", usage.value.errors[0].rule)
    assert trace.value.errors[0] == FieldError("column gpu_milli", "abc", "must be an integer in [0, 1000]")
    assert str(trace.value) == "pods.csv:2: column gpu_milli='abc': must be an integer in [0, 1000]"
