"""Repack at saturation: unallocated GPU % when arrivals start to fail, no repack vs periodic vs on failure.

The FGD replay of `gpupack simulate` (shuffled openb trace, arrivals until the cluster is full, failed pods
dropped, no departures), three ways (bench/workloads/saturate.py): no repack; the repack planner every
`--every` % of arrived capacity (at most `--max-evictions` moves each time); and, for each arrival that fits
nowhere, the room planner (app/tools/repack/room.py, the same code as `gpupack repack --for`) with at most
`--max-moves` moves. Reports unallocated GPU % at arrived = 100 % and evictions per placed pod, medians over
seeds. Adds the key "saturation" to bench/results/repack.json (the churn bench's keys are kept).
Run: .venv/bin/python bench/repack_room.py [--traces default --seeds 42-44 --max-moves 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from packing import _trace  # noqa: E402
from repack import check_inputs, common_flags, provenance, run_jobs  # noqa: E402

from app.core.placement import registry  # noqa: E402
from bench.workloads.saturate import Mode, saturate  # noqa: E402

Job = tuple[str, str, int, str, dict[str, Any]]  # traces dir, trace, seed, mode, knobs


def run_job(job: Job) -> dict[str, Any]:
    traces_dir, trace, seed, mode, knobs = job
    nodes, pods, workload = _trace(traces_dir, trace)
    r = saturate(
        nodes,
        pods,
        registry.create(knobs["policy"], workload),
        workload,
        seed=seed,
        mode=Mode(mode),
        inflate=knobs["inflate"],
        max_moves=knobs["max_moves"],
        every_pct=knobs["every_pct"],
        max_evictions=knobs["max_evictions"],
    )
    return {
        "trace": trace,
        "seed": seed,
        "mode": mode,
        "unallocated_pct_at_100": round(r.unallocated_pct_at_100, 3),
        "placed": r.placed,
        "failed": r.failed,
        "evictions": r.evictions,
        "rescued": r.rescued,
        "running_at_first_failure": r.running_at_first_failure,
        "could_move_at_first_failure": r.could_move_at_first_failure,
        "evictions_per_placed_pod": round(r.evictions_per_placed_pod, 5),
        "seconds": round(r.seconds, 1),
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for trace in sorted({r["trace"] for r in rows}):
        entry: dict[str, Any] = {}
        for mode in Mode:
            runs = sorted(
                (r for r in rows if r["trace"] == trace and r["mode"] == mode), key=lambda r: r["seed"]
            )
            if not runs:
                continue
            entry[str(mode)] = {
                "seeds": [r["seed"] for r in runs],
                "unallocated_pct_at_100_median": round(
                    statistics.median(r["unallocated_pct_at_100"] for r in runs), 3
                ),
                "unallocated_pct_at_100_per_seed": [r["unallocated_pct_at_100"] for r in runs],
                "failed_median": statistics.median(r["failed"] for r in runs),
                "evictions_median": statistics.median(r["evictions"] for r in runs),
                "rescued_median": statistics.median(r["rescued"] for r in runs),
                "could_move_of_running_at_first_failure_median": [
                    statistics.median(r["could_move_at_first_failure"] for r in runs),
                    statistics.median(r["running_at_first_failure"] for r in runs),
                ],
                "evictions_per_placed_pod_median": round(
                    statistics.median(r["evictions_per_placed_pod"] for r in runs), 5
                ),
            }
        out[trace] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    common_flags(ap)
    ap.add_argument("--inflate", type=float, default=1.02, help="arrivals up to this x capacity")
    ap.add_argument("--max-moves", type=int, default=4, help="moves per failed arrival (on-failure)")
    ap.add_argument("--every", type=float, default=5.0, help="periodic: repack every this % arrived")
    ap.add_argument("--max-evictions", type=int, default=200, help="periodic: evictions per repack")
    args = ap.parse_args(argv)
    checked = check_inputs(args, "repack_room")
    if checked is None:
        return 2
    seeds, traces, traces_dir = checked
    knobs = {
        "policy": args.policy,
        "inflate": args.inflate,
        "max_moves": args.max_moves,
        "every_pct": args.every,
        "max_evictions": args.max_evictions,
    }
    # slowest first, so the pool's two workers finish together
    order = {Mode.PERIODIC: 0, Mode.ON_FAILURE: 1, Mode.NONE: 2}
    jobs: list[Job] = [
        (str(traces_dir), t, s, str(m), knobs)
        for m in sorted(Mode, key=order.__getitem__)
        for t in traces
        for s in seeds
    ]
    started = time.perf_counter()
    rows = run_jobs(
        run_job,
        jobs,
        args.workers,
        lambda row: (
            f"{row['trace']} seed {row['seed']} {row['mode']}: "
            f"unallocated {row['unallocated_pct_at_100']:.2f} %, {row['evictions']} evictions, "
            f"{row['rescued']} rescued ({row['seconds']} s)"
        ),
    )
    rows.sort(key=lambda r: (r["trace"], r["seed"], r["mode"]))
    section = {
        "question": "unallocated GPU % when arrivals start to fail: no repack, periodic, on failure",
        "method": "bench/workloads/saturate.py: the FGD replay (arrivals until full, no departures); "
        "unallocated "
        "GPU % at arrived = 100 %",
        **provenance(traces_dir, traces, seeds, knobs),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "summary": summarise(rows),
        "runs": rows,
    }
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {}
    result["saturation"] = section
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(section["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
