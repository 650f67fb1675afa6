"""Burstable GPU memory on openb: how many more pods fit at request/limit 0.75 and 0.5, at what exposure.

Each trace pod's share is its limit (its peak); at ratio r shared pods request r x that
(`bench.workloads.burst`). Every ratio of a seed replays the same arrivals (limits offered up to `--inflate` x
capacity, failed pods dropped), with gpupack's default policy. Exposure, on the final state: GPUs whose pods'
limits sum above the GPU, shared pods on them, the memory above the GPUs if every pod used its limit at once,
and the fewest evictions that would leave the limits fitting. Writes bench/results/burstable.json.
Run: .venv/bin/python bench/burstable.py [--traces default,gpushare40 --seeds 42-46 --ratios 1,0.75,0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from packing import MAX_WORKERS, NODE_FILE, TRACES, _git_commit, run_jobs  # noqa: E402

from app.core.placement import DEFAULT_POLICY, TargetWorkload, registry  # noqa: E402
from app.tools.sim.command import UsageError, parse_seeds  # noqa: E402
from app.tools.sim.loader import TracePod, load_nodes, load_pods  # noqa: E402
from bench.workloads.burst import BurstResult, burst  # noqa: E402

Job = tuple[str, str, float, int, float]  # traces_dir, trace, ratio, seed, inflate


@cache
def _trace(traces_dir: str, trace: str) -> tuple[Any, tuple[TracePod, ...], TargetWorkload]:
    root = Path(traces_dir)
    nodes = load_nodes(root / NODE_FILE)
    pods = load_pods(root / f"openb_pod_list_{trace}.csv")
    # The yardstick is the workload as written (the limits): what users would otherwise have asked for.
    return nodes, pods, TargetWorkload.from_demands(p.demand for p in pods).on_fleet(nodes)


def run_job(job: Job) -> dict[str, Any]:
    traces_dir, trace, ratio, seed, inflate = job
    nodes, pods, workload = _trace(traces_dir, trace)
    r: BurstResult = burst(
        nodes,
        pods,
        registry.create(DEFAULT_POLICY, workload),
        workload,
        ratio=ratio,
        seed=seed,
        inflate=inflate,
    )
    return {
        "trace": trace,
        "ratio": ratio,
        "seed": seed,
        "arrived": r.arrived,
        "placed": r.placed,
        "placed_gpu": r.placed_gpu,
        "placed_shared": r.placed_shared,
        "gpus_in_use": r.gpus_in_use,
        "requested_pct": r.requested_pct,
        "limits_pct": r.limits_pct,
        "host_cpu_pct": r.host_cpu_pct,
        "overcommitted_gpus_pct": r.overcommitted_pct,
        "exposed_pods_pct": r.exposed_pct,
        "over_soft_pct": r.over_soft_pct,
        "evictions_if_all_burst_pct": r.evictions_pct,
        "seconds": r.seconds,
    }


KEYS = (
    "placed_gpu",
    "placed_shared",
    "requested_pct",
    "limits_pct",
    "host_cpu_pct",
    "overcommitted_gpus_pct",
    "exposed_pods_pct",
    "over_soft_pct",
    "evictions_if_all_burst_pct",
    "seconds",
)


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per trace and ratio: means over seeds, and GPU pods placed relative to ratio 1 on the same seed."""
    base = {(r["trace"], r["seed"]): r["placed_gpu"] for r in rows if r["ratio"] == 1.0}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for trace in sorted({r["trace"] for r in rows}):
        for ratio in sorted({r["ratio"] for r in rows}, reverse=True):
            runs = sorted(
                (r for r in rows if (r["trace"], r["ratio"]) == (trace, ratio)), key=lambda r: r["seed"]
            )
            entry: dict[str, Any] = {"seeds": [r["seed"] for r in runs]}
            for key in KEYS:
                entry[key] = round(statistics.fmean(float(r[key]) for r in runs), 3)
            gains = [
                100.0 * (r["placed_gpu"] / base[(trace, r["seed"])] - 1)
                for r in runs
                if (trace, r["seed"]) in base
            ]
            if gains:
                entry["more_gpu_pods_pct"] = round(statistics.fmean(gains), 2)
                entry["more_gpu_pods_pct_per_seed"] = [round(g, 2) for g in gains]
            out.setdefault(trace, {})[f"{ratio:g}"] = entry
    return out


def format_table(ours: dict[str, Any]) -> str:
    head = (
        f"{'trace':<12}{'ratio':>6}{'GPU pods':>10}{'more':>8}{'shared':>8}{'req %':>7}{'lim %':>7}"
        f"{'CPU %':>7}{'GPUs oc %':>10}{'exposed %':>10}{'over-soft %':>12}{'evict %':>9}"
    )
    lines = [
        "means over seeds; % of GPU capacity, of GPUs in use or of shared pods placed (see the docstring)",
        head,
    ]
    for trace, ratios in ours.items():
        for ratio, e in ratios.items():
            more = f"{e['more_gpu_pods_pct']:+.1f}%" if "more_gpu_pods_pct" in e else "-"
            lines.append(
                f"{trace:<12}{ratio:>6}{e['placed_gpu']:>10.0f}{more:>8}{e['placed_shared']:>8.0f}"
                f"{e['requested_pct']:>7.1f}{e['limits_pct']:>7.1f}{e['host_cpu_pct']:>7.1f}{e['overcommitted_gpus_pct']:>10.1f}"
                f"{e['exposed_pods_pct']:>10.1f}{e['over_soft_pct']:>12.1f}{e['evictions_if_all_burst_pct']:>9.1f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--traces-dir", default=str(REPO.parent / "shared" / "traces"))
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--seeds", default="42-46")
    ap.add_argument("--ratios", default="1,0.75,0.5", help="request/limit ratios; 1 is the baseline")
    ap.add_argument("--inflate", type=float, default=2.6, help="limits offered, x GPU capacity")
    ap.add_argument("--workers", type=int, default=MAX_WORKERS, help=f"processes, at most {MAX_WORKERS}")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "burstable.json"))
    args = ap.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        ratios = sorted({float(r) for r in args.ratios.split(",") if r} | {1.0}, reverse=True)
    except (UsageError, ValueError) as e:
        print(f"burstable: {e}", file=sys.stderr)
        return 2
    if any(not 0 < r <= 1 for r in ratios):
        print(f"burstable: --ratios={args.ratios!r}: each must be in (0, 1]", file=sys.stderr)
        return 2
    traces = [t for t in args.traces.split(",") if t]
    traces_dir = Path(args.traces_dir).resolve()
    for t in traces:
        if not (traces_dir / f"openb_pod_list_{t}.csv").is_file():
            print(f"burstable: --traces={t!r}: no openb_pod_list_{t}.csv in {traces_dir}", file=sys.stderr)
            return 2
    jobs = [(str(traces_dir), t, r, s, args.inflate) for t in traces for r in ratios for s in seeds]
    loadavg_at_start = [round(x, 1) for x in os.getloadavg()]
    started = time.perf_counter()
    rows = run_jobs(
        run_job,
        jobs,
        args.workers,
        lambda row: (
            f"{row['trace']} ratio {row['ratio']:g} seed {row['seed']}: "
            f"{row['placed_gpu']} GPU pods ({row['seconds']:.1f} s)"
        ),
    )
    ours = summarise(rows)
    print(format_table(ours))
    doc = {
        "question": "How many more pods fit when shared pods request 0.75 or 0.5 of their limit, and what "
        "eviction exposure does that cost?",
        "inputs": {
            "traces_dir": str(traces_dir),
            "traces": traces,
            "seeds": list(seeds),
            "ratios": ratios,
            "inflate": args.inflate,
            "policy": DEFAULT_POLICY,
            "workers": max(1, min(args.workers, MAX_WORKERS)),
            "method": "bench.workloads.burst: a trace pod's share is its limit; shared pods (< 1 GPU per "
            "device) "
            "request ratio x limit (rounded up to a milli), whole-GPU pods unchanged; the same FGD arrival "
            "sequence for every ratio of a seed (limits offered up to inflate x capacity), failed pods "
            "dropped, no departures; exposure on the final state, a share of a GPU standing for that share "
            "of its memory",
            "definitions": {
                "more_gpu_pods_pct": "GPU pods placed vs ratio 1 on the same seed",
                "host_cpu_pct": "host CPU requested by the pods placed, % of the nodes' CPU",
                "overcommitted_gpus_pct": "GPUs in use whose pods' limits sum above the GPU",
                "exposed_pods_pct": "shared pods on such GPUs (eviction candidates when they use more than "
                "their request and neighbours claim theirs)",
                "over_soft_pct": "if every pod used its limit at once: memory above the GPUs' size, % of the "
                "memory of the GPUs in use",
                "evictions_if_all_burst_pct": "fewest shared pods to evict (largest limits first, per GPU) "
                "so the limits left fit, % of shared pods placed; an upper bound for one moment",
            },
        },
        "versions": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "gpupack_commit": _git_commit(),
        },
        "wall_seconds": round(time.perf_counter() - started, 1),
        "loadavg_at_start": loadavg_at_start,
        "loadavg_at_end": [round(x, 1) for x in os.getloadavg()],
        "results": ours,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
