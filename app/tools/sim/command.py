"""`gpupack simulate`: replay a trace (or the built-in synthetic one) with each placement policy."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TextIO

from app.core.errors import FieldError, InputError
from app.core.model import Node
from app.core.placement import DEFAULT_POLICY, TargetWorkload, registry
from app.tools.sim import report
from app.tools.sim.engine import Progress, RunResult, simulate
from app.tools.sim.loader import TracePod, load_nodes, load_pods, read_nodes, read_pods

SYNTHETIC_NODES = "synthetic_nodes.csv"
SYNTHETIC_PODS = "synthetic_pods.csv"
MAX_SEEDS = 1000


class UsageError(InputError):
    """Bad command-line input: names the flag, the value and the rule."""

    def __init__(self, flag: str, value: str, rule: str):
        super().__init__([FieldError(flag, value, rule)])


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a pod trace with each placement policy (FGD/openb methodology)",
        description="Replay an openb-format trace: shuffled arrival, inflated to --inflate x GPU capacity, "
        "failed pods dropped, no departures. Without --nodes/--pods, runs a small built-in synthetic trace.",
    )
    p.add_argument("--nodes", help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
    p.add_argument("--pods", help="pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...])")
    p.add_argument(
        "--policy",
        action="append",
        help=f"policy to run, repeatable (default: all of {', '.join(registry.names())})",
    )
    p.add_argument("--seeds", default="42-51", help="seeds: N, A-B or a comma list of those (default 42-51)")
    p.add_argument(
        "--inflate", default="1.3", help="total GPU request as a multiple of capacity (default 1.3)"
    )
    p.add_argument(
        "--jobs",
        default=str(os.cpu_count() or 1),
        help="runs at once, one process each (default: the CPU count); results do not depend on it",
    )
    p.add_argument("--json", help="write the per-policy means to this JSON file")
    p.add_argument("--plot", help="draw allocation vs arrived workload to this PNG (needs matplotlib)")
    p.set_defaults(func=run)


def parse_seeds(raw: str) -> tuple[int, ...]:
    seeds: list[int] = []
    for part in raw.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip(), flags=re.ASCII)
        if not m or (m[2] is not None and int(m[2]) < int(m[1])):
            raise UsageError("--seeds", raw, "must be N, A-B with A <= B, or a comma list of those")
        seeds.extend(range(int(m[1]), int(m[2] or m[1]) + 1))
        if len(seeds) > MAX_SEEDS:
            raise UsageError("--seeds", raw, f"must name at most {MAX_SEEDS} seeds")
    return tuple(dict.fromkeys(seeds))


def parse_jobs(raw: str) -> int:
    if not re.fullmatch(r"[1-9][0-9]{0,2}", raw.strip(), flags=re.ASCII):
        raise UsageError("--jobs", raw, "must be a whole number from 1 to 999")
    return int(raw)


def parse_inflate(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not re.fullmatch(r"\d+(\.\d+)?", raw.strip(), flags=re.ASCII) or not 0 < value <= 10:
        raise UsageError("--inflate", raw, "must be a decimal number in (0, 10]")
    return value


def parse_policies(raw: list[str] | None) -> tuple[str, ...]:
    if not raw:
        return registry.names()
    for name in raw:
        if name not in registry.names():
            raise UsageError("--policy", name, f"must be one of {', '.join(registry.names())}")
    return tuple(dict.fromkeys(raw))


def load_trace(nodes: str | None, pods: str | None) -> tuple[tuple[Node, ...], tuple[TracePod, ...], str]:
    if nodes is None and pods is None:
        data = resources.files("app.core.data")
        return (
            read_nodes(_text(data.joinpath(SYNTHETIC_NODES).read_text()), f"built-in {SYNTHETIC_NODES}"),
            read_pods(_text(data.joinpath(SYNTHETIC_PODS).read_text()), f"built-in {SYNTHETIC_PODS}"),
            "built-in synthetic trace",
        )
    for flag, value in (("--nodes", nodes), ("--pods", pods)):
        if value is None:
            other = "--pods" if flag == "--nodes" else "--nodes"
            raise UsageError(flag, "", f"is required together with {other}")
        if not Path(value).is_file():
            raise UsageError(flag, value, "must be an existing, readable file")
    assert nodes is not None and pods is not None
    node_list, pod_list = load_nodes(Path(nodes)), load_pods(Path(pods))
    # Replaying needs GPU capacity to fill and pods that fill it; say so rather than divide by zero.
    if not any(n.gpus for n in node_list):
        raise UsageError("--nodes", nodes, "must list at least one node with GPUs (column gpu > 0)")
    if not any(p.demand.count for p in pod_list):
        raise UsageError(
            "--pods", pods, "must list at least one pod that asks for a GPU (column num_gpu > 0)"
        )
    return node_list, pod_list, f"{Path(pods).name} on {Path(nodes).name}"


def _text(content: str) -> TextIO:
    import io

    return io.StringIO(content, newline="")


Trace = tuple[Sequence[Node], Sequence[TracePod], TargetWorkload]


@dataclass(frozen=True, slots=True)
class Run:
    """One (policy, seed) replay."""

    policy: str
    seed: int
    inflate: float

    @property
    def label(self) -> str:
        return f"{self.policy} seed {self.seed}"

    def simulate(self, trace: Trace, progress: Progress | None = None) -> RunResult:
        nodes, pods, workload = trace
        policy = registry.create(self.policy, workload)
        return simulate(
            nodes, pods, policy, workload, seed=self.seed, inflate=self.inflate, progress=progress
        )


# The trace, shared with worker processes by fork (set just before the pool starts), not pickled per run.
_SHARED: Trace | None = None


def _run_shared(run: Run) -> RunResult:
    assert _SHARED is not None
    return run.simulate(_SHARED)


def _in_parallel(runs: Sequence[Run], trace: Trace, jobs: int, progress: ProgressLine) -> list[RunResult]:
    """The runs in `jobs` forked processes; each run is deterministic, so results equal a serial run's."""
    global _SHARED  # noqa: PLW0603 - read by the forked workers
    _SHARED = trace
    try:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=min(jobs, len(runs)), mp_context=ctx) as pool:
            futures = [pool.submit(_run_shared, r) for r in runs]
            results = []
            for r, future in zip(runs, futures, strict=True):
                with progress.running(r.label):
                    results.append(future.result())
            return results
    finally:
        _SHARED = None


class ProgressLine:
    """One line on stderr, rewritten in place on a terminal, printed once per run otherwise."""

    def __init__(self, stream: TextIO, total_runs: int):
        self.stream = stream
        self.tty = stream.isatty()
        self.total_runs = total_runs
        self.run = 0
        self.label = ""

    @contextmanager
    def running(self, label: str) -> Iterator[None]:
        self.run += 1
        self.label = label
        yield
        if not self.tty:
            self.stream.write(f"[{self.run}/{self.total_runs}] {self.label}: done\n")
            self.stream.flush()

    def __call__(self, done: int, total: int) -> None:
        if not self.tty:
            return
        width = 30
        filled = width * done // total
        bar = "#" * filled + "." * (width - filled)
        end = "\n" if done == total and self.run == self.total_runs else ""
        self.stream.write(
            f"\r[{self.run}/{self.total_runs}] {self.label:<22} [{bar}] {done}/{total} pods{end}"
        )
        self.stream.flush()


def run(args: argparse.Namespace) -> int:
    try:
        seeds = parse_seeds(args.seeds)
        inflate = parse_inflate(args.inflate)
        policies = parse_policies(args.policy)
        jobs = parse_jobs(args.jobs)
        nodes, pods, label = load_trace(args.nodes, args.pods)
    except InputError as e:  # a flag (UsageError) or a trace file (TraceError)
        print(f"gpupack simulate: {e}", file=sys.stderr)
        return 2
    workload = TargetWorkload.from_demands(p.demand for p in pods).on_fleet(nodes)
    runs = [Run(name, seed, inflate) for name in policies for seed in seeds]
    progress = ProgressLine(sys.stderr, len(runs))
    if jobs > 1 and len(runs) > 1:
        results = _in_parallel(runs, (nodes, pods, workload), jobs, progress)
    else:
        results = []
        for r in runs:
            with progress.running(r.label):
                results.append(r.simulate((nodes, pods, workload), progress))
    summaries = report.summarise(results)
    gpus = sum(len(n.gpus) for n in nodes)
    print(
        f"{label}: {len(nodes)} nodes, {gpus} GPUs, {len(pods)} pods; seeds {args.seeds}; inflate {inflate}"
    )
    print(
        f"GPU allocation and unallocated GPU, % of capacity at 100 % / 130 % arrived "
        f"(mean of {len(seeds)} seeds)"
    )
    print(report.format_table(summaries))
    if args.json:
        inputs = {
            "nodes": args.nodes or SYNTHETIC_NODES,
            "pods": args.pods or SYNTHETIC_PODS,
            "seeds": list(seeds),
        }
        inputs |= {"inflate": inflate, "default_policy": DEFAULT_POLICY}
        Path(args.json).write_text(json.dumps(report.to_json(summaries, inputs), indent=2) + "\n")
    if args.plot:
        report.plot(summaries, Path(args.plot), label)
    return 0
