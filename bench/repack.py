"""Repack in the simulator: unallocated GPU % with and without periodic repacking, on a trace with departures.

Each run fills the openb cluster the FGD way up to 100 % arrived, then plays rounds of departures and
arrivals (bench/workloads/churn.py); with repack, the planner (app/tools/repack/plan.py, the same code as
`gpupack repack`) runs after each round's departures and its moves are carried out before the arrivals.
Reports medians over rounds and seeds. Writes bench/results/repack.json.
Run: .venv/bin/python bench/repack.py [--traces default --seeds 42-44 --rounds 4 --max-evictions 200]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from packing import MAX_WORKERS, NODE_FILE, _git_commit, _sha256, _trace, pod_file, run_jobs  # noqa: E402

from app.core.placement import DEFAULT_POLICY, registry  # noqa: E402
from app.tools.sim.command import UsageError, parse_seeds  # noqa: E402
from bench.workloads.churn import churn  # noqa: E402

TRACES = ("default", "gpushare40", "gpushare100")

Job = tuple[str, str, int, bool, dict[str, Any]]  # traces dir, trace, seed, repack, knobs


def run_job(job: Job) -> dict[str, Any]:
    traces_dir, trace, seed, repack, knobs = job
    nodes, pods, workload = _trace(traces_dir, trace)
    policy = registry.create(knobs["policy"], workload)
    r = churn(
        nodes,
        pods,
        policy,
        workload,
        seed=seed,
        rounds=knobs["rounds"],
        depart=knobs["depart"],
        pressure=knobs["pressure"],
        repack=repack,
        max_evictions=knobs["max_evictions"],
    )
    return {
        "trace": trace,
        "seed": seed,
        "repack": repack,
        "unallocated_pct_after_fill": round(r.unallocated_pct[0], 3),
        "unallocated_pct_per_round": [round(v, 3) for v in r.unallocated_pct[1:]],
        "unallocated_pct_median": round(r.median_unallocated, 3),
        "evictions_per_round": list(r.evictions),
        "gpus_freed_per_round": list(r.gpus_freed),
        "idle_gpus_per_round": list(r.idle_gpus),
        "seconds": round(r.seconds, 1),
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for trace in sorted({r["trace"] for r in rows}):
        entry: dict[str, Any] = {}
        for repack in (False, True):
            runs = sorted(
                (r for r in rows if r["trace"] == trace and r["repack"] == repack), key=lambda r: r["seed"]
            )
            if not runs:
                continue
            per_round = [v for r in runs for v in r["unallocated_pct_per_round"]]
            entry["with_repack" if repack else "without_repack"] = {
                "seeds": [r["seed"] for r in runs],
                "unallocated_pct_median": round(statistics.median(per_round), 3),
                "unallocated_pct_median_per_seed": [r["unallocated_pct_median"] for r in runs],
                "idle_gpus_median": statistics.median(v for r in runs for v in r["idle_gpus_per_round"]),
                "evictions_per_round_median": statistics.median(
                    v for r in runs for v in r["evictions_per_round"]
                ),
                "gpus_freed_per_round_median": statistics.median(
                    v for r in runs for v in r["gpus_freed_per_round"]
                ),
            }
        if "with_repack" in entry and "without_repack" in entry:
            entry["delta_unallocated_pct_points"] = round(
                entry["with_repack"]["unallocated_pct_median"]
                - entry["without_repack"]["unallocated_pct_median"],
                3,
            )
        out[trace] = entry
    return out


def common_flags(ap: argparse.ArgumentParser) -> None:
    """The flags every repack bench takes: which traces, seeds and policy, how many processes, where to."""
    ap.add_argument("--traces-dir", default=str(REPO.parent / "shared" / "traces"))
    ap.add_argument("--traces", default=",".join(TRACES), help="comma list of trace names")
    ap.add_argument("--seeds", default="42-44")
    ap.add_argument("--policy", default=DEFAULT_POLICY, choices=registry.names())
    ap.add_argument("--workers", type=int, default=MAX_WORKERS, help=f"processes, at most {MAX_WORKERS}")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "repack.json"))


def provenance(
    traces_dir: Path, traces: Sequence[str], seeds: Sequence[int], knobs: dict[str, Any]
) -> dict[str, Any]:
    """The "inputs" (trace and node file hashes, seeds, knobs) and "versions" of a result."""
    return {
        "inputs": {
            "traces": {t: _sha256(traces_dir / pod_file(t)) for t in traces},
            "nodes": _sha256(traces_dir / NODE_FILE),
            "seeds": list(seeds),
            **knobs,
        },
        "versions": {"python": platform.python_version(), "git_commit": _git_commit()},
    }


def check_inputs(args: argparse.Namespace, prog: str) -> tuple[tuple[int, ...], list[str], Path] | None:
    """Seeds, traces and traces folder from --seeds, --traces, --traces-dir; None once a bad one is said."""
    try:
        seeds = parse_seeds(args.seeds)
    except UsageError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    traces = [t for t in args.traces.split(",") if t]
    traces_dir = Path(args.traces_dir).resolve()
    for t in traces:
        if not (traces_dir / pod_file(t)).is_file():
            print(f"{prog}: --traces={t!r}: {traces_dir / pod_file(t)} does not exist", file=sys.stderr)
            return None
    return seeds, traces, traces_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    common_flags(ap)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument(
        "--depart", type=float, default=0.1, help="probability that a running pod departs per round"
    )
    ap.add_argument("--pressure", type=float, default=0.3, help="extra arrivals per round, x capacity")
    ap.add_argument("--max-evictions", type=int, default=200, help="evictions per repack round")
    args = ap.parse_args(argv)
    checked = check_inputs(args, "repack")
    if checked is None:
        return 2
    seeds, traces, traces_dir = checked
    knobs = {
        "policy": args.policy,
        "rounds": args.rounds,
        "depart": args.depart,
        "pressure": args.pressure,
        "max_evictions": args.max_evictions,
    }
    jobs: list[Job] = [
        (str(traces_dir), t, s, rp, knobs) for t in traces for s in seeds for rp in (True, False)
    ]
    started = time.perf_counter()
    rows = run_jobs(
        run_job,
        jobs,
        args.workers,
        lambda row: (
            f"{row['trace']} seed {row['seed']} repack={row['repack']}: "
            f"median unallocated {row['unallocated_pct_median']:.2f} % ({row['seconds']} s)"
        ),
    )
    rows.sort(key=lambda r: (r["trace"], r["seed"], r["repack"]))
    result = {
        "question": "unallocated GPU % with and without periodic repack, openb traces with departures",
        "method": "bench/workloads/churn.py: fill to 100 % arrived, then rounds of departures, repack, "
        "arrivals",
        **provenance(traces_dir, traces, seeds, knobs),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "summary": summarise(rows),
        "runs": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
