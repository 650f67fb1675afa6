"""MIG vs whole GPUs on openb: how many physical GPUs the same pods need, with and without MIG devices.

The openb `default` trace's GPU pods (CPU-only pods left out), in one seeded shuffled order, are placed
by the simulator's engine (`app.tools.sim.engine.replay`, the extender's placement code) on a cluster of
A100-80GB nodes, three ways:
  whole   every pod takes whole GPUs (a device plugin without sharing or MIG): the baseline;
  mig     a mixed cluster: nodes whose 8 GPUs are all partitioned into `--layouts` (enough for every
          MIG request) followed by nodes of whole GPUs (enough for every other pod); a one-GPU share becomes
          `gpu-memory` (its share of 81920 MiB) with `gpupack.io/isolation: mig`, or whole GPUs where no
          MIG device of the layout holds it; every other pod takes whole GPUs;
  shared  gpupack's MPS sharing on whole GPUs (shares as fractions), for reference.
Each cluster is large enough that no pod fails (idle nodes count for nothing); host CPU and memory
are not tracked, so the numbers compare GPUs only. Writes bench/results/mig.json.

    .venv/bin/python bench/mig.py [--layouts 3g.40gb,3g.40gb 3g.40gb,2g.20gb,1g.10gb,1g.10gb]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.core import catalog  # noqa: E402
from app.core.model import Demand, Gpu, Node  # noqa: E402
from app.core.placement import TargetWorkload, registry  # noqa: E402
from app.tools.sim.engine import replay  # noqa: E402
from app.tools.sim.loader import load_pods  # noqa: E402
from bench.workloads.migvariant import as_mig, as_whole, partition, physical_gpus_used  # noqa: E402

MODEL = catalog.lookup("A100-80GB")
GPUS_PER_NODE = 8
POD_FILE = "openb_pod_list_default.csv"
LAYOUTS = ("3g.40gb,3g.40gb", "3g.40gb,2g.20gb,1g.10gb,1g.10gb", "2g.20gb,2g.20gb,2g.20gb,1g.10gb")


def cluster(nodes: int) -> list[Node]:
    gpus = tuple(Gpu(i, MODEL.name, MODEL.memory_mib) for i in range(GPUS_PER_NODE))
    return [Node(f"a100-{n:04d}", gpus) for n in range(nodes)]


def run(nodes: list[Node], demands: list[Demand], policy: str, workload: TargetWorkload) -> dict[str, Any]:
    started = time.perf_counter()
    placed, after = replay(nodes, demands, registry.create(policy, workload), workload)
    return {
        "gpus_used": physical_gpus_used(after),
        "failed": sum(1 for p in placed if p is None),
        "seconds": round(time.perf_counter() - started, 2),
    }


def _git_commit() -> str | None:
    out = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--traces-dir", default=str(REPO.parent / "shared" / "traces"))
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS))
    ap.add_argument("--policies", nargs="+", default=["fragaware", "binpack"])
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "mig.json"))
    args = ap.parse_args(argv)
    layouts = {}
    for raw in args.layouts:
        names = tuple(raw.split(","))
        if rule := catalog.mig_layout_error(MODEL, names):
            print(f"mig: --layouts={raw!r}: {rule}", file=sys.stderr)
            return 2
        layouts[raw] = [p for n in names if (p := MODEL.mig_profile(n)) is not None]
    pods = [p for p in load_pods(Path(args.traces_dir) / POD_FILE) if p.demand.count > 0]
    random.Random(args.seed).shuffle(pods)
    shares = [replace(p.demand, cpu_milli=0, host_memory_mib=0) for p in pods]
    workload = TargetWorkload.from_demands(shares)
    whole = [as_whole(d) for d in shares]
    n_nodes = -(-sum(d.count for d in whole) // GPUS_PER_NODE) + 1
    shapes = Counter("whole" if d.milli == 1000 or d.count > 1 else "share" for d in shares)
    results: dict[str, Any] = {}
    for policy in args.policies:
        base = run(cluster(n_nodes), whole, policy, workload)
        row: dict[str, Any] = {"whole": base, "shared": run(cluster(n_nodes), shares, policy, workload)}
        for raw, layout in layouts.items():
            largest = max(p.memory_mib for p in layout)
            demands = [as_mig(d, MODEL, largest) for d in shares]
            partitioned = -(-sum(1 for d in demands if d.mig) // (GPUS_PER_NODE * len(layout))) + 1
            whole_nodes = -(-sum(d.count for d in demands if not d.mig) // GPUS_PER_NODE) + 1
            while True:  # more MIG nodes until every MIG request finds a device of its size
                every = cluster(partitioned + whole_nodes)
                nodes = [partition(n, layout, GPUS_PER_NODE) for n in every[:partitioned]]
                r = run(nodes + every[partitioned:], demands, policy, workload)
                if not r["failed"]:
                    break
                partitioned += -(-partitioned // 4)
            r["mig_nodes"] = partitioned
            r["shares_on_mig"] = sum(1 for d in demands if d.mig)
            r["gpus_saved_vs_whole_pct"] = round(100 * (1 - r["gpus_used"] / base["gpus_used"]), 1)
            row[f"mig {raw}"] = r
        results[policy] = row
        for name, r in row.items():
            extra = f", {r['shares_on_mig']} shares on MIG devices" if "shares_on_mig" in r else ""
            print(f"{policy:<10} {name:<45} {r['gpus_used']:>5} GPUs used, {r['failed']} failed{extra}")
    doc = {
        "question": "How many physical GPUs do openb's GPU pods need with MIG devices vs whole GPUs only?",
        "inputs": {
            "trace": POD_FILE,
            "gpu_pods": len(pods),
            "pod_shapes": dict(shapes),
            "seed": args.seed,
            "cluster": f"{n_nodes} nodes x {GPUS_PER_NODE} {MODEL.name}",
            "mig_cluster": "MIG nodes (all 8 GPUs partitioned) first, then whole-GPU nodes",
            "layouts": list(layouts),
            "method": "app.tools.sim.engine.replay in one shuffled order, no departures; host CPU/memory "
            "untracked; gpus_used = whole GPUs holding a pod + partitioned GPUs with a MIG device "
            "holding a pod",
        },
        "versions": {"python": platform.python_version(), "gpupack_commit": _git_commit()},
        "results": results,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
