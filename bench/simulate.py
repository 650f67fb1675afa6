"""How long does `gpupack simulate` take, start-up included, on the openb default trace?

Times the installed CLI as a user runs it (a fresh process each time, wall clock and the CPU time of the
process and its children): one seed of the default policy (--runs times, median), every seed (42-51)
of every policy (--runs times each, medians), and every seed of each policy alone in one process
(--jobs 1, --runs times each, medians: where the CPU goes). The machine is shared, so CPU seconds are
reported beside wall seconds.

Usage: .venv/bin/python bench/simulate.py [--traces-dir /work/shared/traces] [--runs 3] [--jobs N]
Writes bench/results/simulate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GPUPACK = Path(sys.executable).with_name("gpupack")
POLICIES = ("binpack", "fgd", "fragaware", "spread")


def timed(argv: list[str]) -> dict[str, Any]:
    """Run the CLI once: wall seconds, CPU seconds of the child, and the table's last lines."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([str(GPUPACK), *argv], check=True, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "table": done.stdout.strip().splitlines()[-5:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces-dir", default="/work/shared/traces")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--jobs", default=str(os.cpu_count() or 1))
    ap.add_argument("--out", default=str(REPO / "bench/results/simulate.json"))
    args = ap.parse_args()
    traces = Path(args.traces_dir)
    trace = ["--nodes", str(traces / "openb_node_list_gpu_node.csv")]
    trace += ["--pods", str(traces / "openb_pod_list_default.csv")]
    out: dict[str, Any] = {
        "inputs": vars(args),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        # The build machine is shared: a load average above the CPU count means these are contended numbers.
        "loadavg_at_start": [round(x, 1) for x in os.getloadavg()],
    }
    one = [timed(["simulate", *trace, "--policy", "fragaware", "--seeds", "42"]) for _ in range(args.runs)]
    out["one_seed_default_policy"] = {
        "command": "gpupack simulate --nodes …/openb_node_list_gpu_node.csv"
        " --pods …/openb_pod_list_default.csv --policy fragaware --seeds 42",
        "runs": one,
        "median_wall_s": statistics.median(r["wall_s"] for r in one),
        "median_cpu_s": statistics.median(r["cpu_s"] for r in one),
    }
    print(json.dumps(out["one_seed_default_policy"]), flush=True)
    every = [timed(["simulate", *trace, "--seeds", "42-51", "--jobs", args.jobs]) for _ in range(args.runs)]
    out["ten_seeds_four_policies"] = {
        "command": f"gpupack simulate --nodes … --pods … --seeds 42-51 --jobs {args.jobs}",
        "runs": every,
        "median_wall_s": statistics.median(r["wall_s"] for r in every),
        "median_cpu_s": statistics.median(r["cpu_s"] for r in every),
    }
    print(json.dumps(out["ten_seeds_four_policies"]), flush=True)
    out["ten_seeds_per_policy"] = {}
    for policy in POLICIES:
        argv = ["simulate", *trace, "--seeds", "42-51", "--policy", policy, "--jobs", "1"]
        alone = [timed(argv) for _ in range(args.runs)]
        out["ten_seeds_per_policy"][policy] = {
            "command": f"gpupack simulate --nodes … --pods … --seeds 42-51 --policy {policy} --jobs 1",
            "cpu_s": [r["cpu_s"] for r in alone],
            "median_cpu_s": statistics.median(r["cpu_s"] for r in alone),
            "median_wall_s": statistics.median(r["wall_s"] for r in alone),
        }
        print(policy, json.dumps(out["ten_seeds_per_policy"][policy]), flush=True)
    out["loadavg_at_end"] = [round(x, 1) for x in os.getloadavg()]
    Path(args.out).write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
