"""Repack at saturation: unallocated GPU % when arrivals start to fail, no repack vs periodic vs on failure.

The FGD replay of `gpupack simulate` (shuffled openb trace, arrivals until the cluster is full, failed pods
dropped, no departures), three ways (app/sim/saturate.py): no repack; the repack planner every `--every`
% of arrived capacity (at most `--max-evictions` moves each time); and, for each arrival that fits nowhere,
the room planner (app/repack/room.py, the same code as `gpupack repack --for`) with at most `--max-moves`
moves. Reports unallocated GPU % at arrived = 100 % and evictions per placed pod, medians over seeds.
Adds the key "saturation" to bench/results/repack.json (the churn bench's keys are kept).
Run: .venv/bin/python bench/repack_room.py [--traces default --seeds 42-44 --max-moves 4]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from packing import MAX_WORKERS, NODE_FILE, _git_commit, _sha256, _trace, pod_file  # noqa: E402
from repack import TRACES  # noqa: E402

from app.placement import DEFAULT_POLICY, registry  # noqa: E402
from app.sim.command import UsageError, parse_seeds  # noqa: E402
from app.sim.saturate import Mode, saturate  # noqa: E402

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
                "evictions_per_placed_pod_median": round(
                    statistics.median(r["evictions_per_placed_pod"] for r in runs), 5
                ),
            }
        out[trace] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--traces-dir", default=str(REPO.parent / "shared" / "traces"))
    ap.add_argument("--traces", default=",".join(TRACES), help="comma list of trace names")
    ap.add_argument("--seeds", default="42-44")
    ap.add_argument("--policy", default=DEFAULT_POLICY, choices=registry.names())
    ap.add_argument("--inflate", type=float, default=1.02, help="arrivals up to this x capacity")
    ap.add_argument("--max-moves", type=int, default=4, help="moves per failed arrival (on-failure)")
    ap.add_argument("--every", type=float, default=5.0, help="periodic: repack every this % arrived")
    ap.add_argument("--max-evictions", type=int, default=200, help="periodic: evictions per repack")
    ap.add_argument("--workers", type=int, default=MAX_WORKERS, help=f"processes, at most {MAX_WORKERS}")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "repack.json"))
    args = ap.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except UsageError as e:
        print(f"repack_room: {e}", file=sys.stderr)
        return 2
    traces = [t for t in args.traces.split(",") if t]
    traces_dir = Path(args.traces_dir).resolve()
    for t in traces:
        if not (traces_dir / pod_file(t)).is_file():
            print(f"repack_room: --traces={t!r}: {traces_dir / pod_file(t)} does not exist", file=sys.stderr)
            return 2
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
    rows: list[dict[str, Any]] = []
    with multiprocessing.Pool(max(1, min(args.workers, MAX_WORKERS))) as pool:
        for row in pool.imap_unordered(run_job, jobs):
            rows.append(row)
            print(
                f"[{len(rows)}/{len(jobs)}] {row['trace']} seed {row['seed']} {row['mode']}: "
                f"unallocated {row['unallocated_pct_at_100']:.2f} %, {row['evictions']} evictions, "
                f"{row['rescued']} rescued ({row['seconds']} s)",
                flush=True,
            )
    rows.sort(key=lambda r: (r["trace"], r["seed"], r["mode"]))
    section = {
        "question": "unallocated GPU % when arrivals start to fail: no repack, periodic, on failure",
        "method": "app/sim/saturate.py: the FGD replay (arrivals until full, no departures); unallocated "
        "GPU % at arrived = 100 %",
        "inputs": {
            "traces": {t: _sha256(traces_dir / pod_file(t)) for t in traces},
            "nodes": _sha256(traces_dir / NODE_FILE),
            "seeds": list(seeds),
            **knobs,
        },
        "versions": {"python": platform.python_version(), "git_commit": _git_commit()},
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
