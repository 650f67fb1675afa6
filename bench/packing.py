"""Packing quality on the openb traces: every gpupack policy vs the published FGD and BestFit numbers.

Replays each trace with the FGD (ATC'23) methodology through `app.tools.sim` and compares unallocated GPU %
at 100 % and 130 % arrived workload (mean over seeds) with the artifact's analysis_allo_discrete.csv.
Besides the trace files, the `pinned` family is generated here: `pinned<share>-<seed>` is the default trace
with <share> % of its GPU pods pinned to GPU models of the fleet (`bench.workloads.constrain`, drawn by
<seed>), the kind of mixed-fleet workload of the paper's gpuspec traces; nothing is published for it.
Writes bench/results/packing.json. Run: .venv/bin/python bench/packing.py [--traces default --seeds 42-43]
(the pinned family: --traces pinned --policies fgd,fragaware --out bench/results/packing-pinned.json)
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import multiprocessing
import platform
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.core.placement import TargetWorkload, registry  # noqa: E402
from app.tools.sim.command import UsageError, parse_seeds  # noqa: E402
from app.tools.sim.engine import simulate  # noqa: E402
from app.tools.sim.loader import TracePod, load_nodes, load_pods  # noqa: E402
from bench.workloads.constrain import pin_models  # noqa: E402

TRACES = ("default", "gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpushare100")
PINNED_SHARES = (5, 10, 20, 30, 40)  # % of GPU pods pinned to models
PINNED_SEEDS = (1, 2, 3)  # generator seeds: which pods, which models
PINNED_BASE = "default"
PINNED = re.compile(r"pinned(\d+)-(\d+)")
# --traces pinned: the whole generated family
FAMILIES = {"pinned": tuple(f"pinned{s:02d}-{g}" for s in PINNED_SHARES for g in PINNED_SEEDS)}
NODE_FILE = "openb_node_list_gpu_node.csv"
PUBLISHED_FILE = "fgd_expected_results/analysis_allo_discrete.csv"
PUBLISHED_POLICIES = {"FGD": "06-FGD", "BestFit": "05-BestFit"}
ARRIVED = (100, 130)
MAX_WORKERS = 2  # the bench machine has 2 shared cores

Job = tuple[str, str, int]  # trace, policy, seed


def pod_file(trace: str) -> str:
    """The CSV a trace is read from (for a generated trace, the one it is generated from)."""
    return f"openb_pod_list_{PINNED_BASE if PINNED.fullmatch(trace) else trace}.csv"


@cache
def _trace(traces_dir: str, trace: str) -> tuple[Any, tuple[TracePod, ...], TargetWorkload]:
    root = Path(traces_dir)
    nodes = load_nodes(root / NODE_FILE)
    pods = load_pods(root / pod_file(trace))
    if m := PINNED.fullmatch(trace):
        pods = pin_models(pods, nodes, int(m[1]) / 100, int(m[2]))
    return nodes, pods, TargetWorkload.from_demands(p.demand for p in pods).on_fleet(nodes)


def run_job(args: tuple[str, Job, float]) -> dict[str, Any]:
    traces_dir, (trace, policy, seed), inflate = args
    nodes, pods, workload = _trace(traces_dir, trace)
    r = simulate(nodes, pods, registry.create(policy, workload), workload, seed=seed, inflate=inflate)
    return {
        "trace": trace,
        "policy": policy,
        "seed": seed,
        "unallocated_pct_at_100": r.unallocated_at(100),
        "unallocated_pct_at_130": r.unallocated_at(130),
        "frag_pct_at_100": r.frag_pct[100],
        "failed_pods": r.failed,
        "pods": r.pods,
        "seconds": r.seconds,
    }


def published(
    traces_dir: Path, traces: list[str], seeds: tuple[int, ...]
) -> dict[str, dict[str, dict[str, float]]]:
    """Mean unallocated % over `seeds` for FGD and BestFit per trace, where the artifact has them."""
    values: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    with (traces_dir / PUBLISHED_FILE).open(newline="") as f:
        for row in csv.DictReader(f):
            workload = row["workload"].removeprefix("openb_pod_list_")
            names = {v: k for k, v in PUBLISHED_POLICIES.items()}
            if workload in traces and row["sc_policy"] in names and int(row["seed"]) in seeds:
                for a in ARRIVED:
                    values[(workload, names[row["sc_policy"]], a)].append(100.0 - float(row[str(a)]))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (trace, policy, a), v in values.items():
        entry = out.setdefault(trace, {}).setdefault(policy, {})
        entry[f"unallocated_pct_at_{a}"] = round(statistics.fmean(v), 3)
        entry["seeds"] = len(v)
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        grouped[(r["trace"], r["policy"])].append(r)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (trace, policy), runs in sorted(grouped.items()):
        runs.sort(key=lambda r: r["seed"])
        entry: dict[str, Any] = {"seeds": [r["seed"] for r in runs]}
        for key in (
            "unallocated_pct_at_100",
            "unallocated_pct_at_130",
            "frag_pct_at_100",
            "failed_pods",
            "seconds",
        ):
            vals = [float(r[key]) for r in runs]
            entry[key] = round(statistics.fmean(vals), 3)
            if key.startswith("unallocated"):
                entry[key + "_sd"] = round(statistics.stdev(vals), 3) if len(vals) > 1 else 0.0
                entry[key + "_per_seed"] = [round(v, 3) for v in vals]
        out.setdefault(trace, {})[policy] = entry
    return out


def deltas(ours: dict[str, Any], pub: dict[str, Any]) -> dict[str, Any]:
    """ours - published, in percentage points (negative = gpupack leaves fewer GPUs unallocated)."""
    out: dict[str, Any] = {}
    for trace, policies in ours.items():
        for policy, entry in policies.items():
            for name, p in pub.get(trace, {}).items():
                for a in ARRIVED:
                    key = f"unallocated_pct_at_{a}"
                    out.setdefault(trace, {}).setdefault(f"{policy}_vs_{name}", {})[key] = round(
                        entry[key] - p[key], 3
                    )
    return out


def format_table(ours: dict[str, Any], pub: dict[str, Any], policies: list[str]) -> str:
    lines = [
        "unallocated GPU % of capacity at arrived = 100 % | 130 % (mean over seeds; lower is better)",
        f"{'trace':<12}" + "".join(f"{p:>16}" for p in policies) + f"{'FGD (pub)':>16}{'BestFit (pub)':>16}",
    ]
    for trace, entries in ours.items():
        cells = []
        for p in policies:
            e = entries.get(p)
            cells.append(
                f"{e['unallocated_pct_at_100']:>7.2f} |{e['unallocated_pct_at_130']:>6.2f}" if e else "-"
            )
        for name in PUBLISHED_POLICIES:
            e = pub.get(trace, {}).get(name)
            cells.append(
                f"{e['unallocated_pct_at_100']:>7.2f} |{e['unallocated_pct_at_130']:>6.2f}" if e else "n/a"
            )
        lines.append(f"{trace:<12}" + "".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def run_jobs(
    fn: Callable[[Any], dict[str, Any]],
    jobs: Sequence[Any],
    workers: int,
    line: Callable[[dict[str, Any]], str],
) -> list[dict[str, Any]]:
    """Every job's row, run in a pool of at most MAX_WORKERS processes, as they finish; one progress line
    per row on stderr (the benches that replay traces share it)."""
    rows: list[dict[str, Any]] = []
    with multiprocessing.Pool(max(1, min(workers, MAX_WORKERS))) as pool:
        for row in pool.imap_unordered(fn, jobs):
            rows.append(row)
            print(f"[{len(rows)}/{len(jobs)}] {line(row)}", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--traces-dir", default=str(REPO.parent / "shared" / "traces"))
    ap.add_argument(
        "--traces",
        default=",".join(TRACES),
        help=f"comma list of trace names or families ({', '.join(FAMILIES)})",
    )
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--policies", default=",".join(registry.names()), help="comma list of policies")
    ap.add_argument("--inflate", type=float, default=1.3)
    ap.add_argument("--workers", type=int, default=MAX_WORKERS, help=f"processes, at most {MAX_WORKERS}")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "packing.json"))
    args = ap.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except UsageError as e:
        print(f"packing: {e}", file=sys.stderr)
        return 2
    traces = [name for t in args.traces.split(",") if t for name in FAMILIES.get(t, (t,))]
    policies = [p for p in args.policies.split(",") if p]
    traces_dir = Path(args.traces_dir).resolve()
    for p in policies:
        if p not in registry.names():
            print(f"packing: --policies={p!r}: must be one of {', '.join(registry.names())}", file=sys.stderr)
            return 2
    for t in traces:
        if not (traces_dir / pod_file(t)).is_file():
            print(f"packing: --traces={t!r}: {traces_dir / pod_file(t)} does not exist", file=sys.stderr)
            return 2
    jobs = [(str(traces_dir), (t, p, s), args.inflate) for t in traces for p in policies for s in seeds]
    # Slow jobs first so the two workers finish together.
    jobs.sort(key=lambda j: j[1][1] != "spread")
    started = time.perf_counter()
    rows = run_jobs(
        run_job,
        jobs,
        args.workers,
        lambda row: (
            f"{row['trace']} {row['policy']} seed {row['seed']}: "
            f"{row['unallocated_pct_at_100']:.2f} % unallocated at 100 % ({row['seconds']:.1f} s)"
        ),
    )
    ours = summarise(rows)
    pub = published(traces_dir, traces, seeds)
    print(format_table(ours, pub, policies))
    doc = {
        "question": "Does gpupack's default policy leave fewer GPUs unallocated than FGD on openb?",
        "inputs": {
            "traces_dir": str(traces_dir),
            "node_list": {"file": NODE_FILE, "sha256": _sha256(traces_dir / NODE_FILE)},
            "pod_lists": {
                t: {"file": pod_file(t), "sha256": _sha256(traces_dir / pod_file(t))}
                | (
                    {"generated": "bench.workloads.constrain.pin_models(share, seed)"}
                    if PINNED.fullmatch(t)
                    else {}
                )
                for t in traces
            },
            "published": PUBLISHED_FILE,
            "seeds": list(seeds),
            "inflate": args.inflate,
            "policies": policies,
            "workers": max(1, min(args.workers, MAX_WORKERS)),
            "method": "FGD/openb: shuffled arrival, inflated to inflate x GPU capacity, failed pods dropped, "
            "no departures; unallocated % = 100 - allocation % at arrived = 100 % / 130 % (discretised bins)",
        },
        "versions": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "gpupack_commit": _git_commit(),
        },
        "wall_seconds": round(time.perf_counter() - started, 1),
        "results": ours,
        "published": pub,
        "deltas_pct_points": deltas(ours, pub),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
