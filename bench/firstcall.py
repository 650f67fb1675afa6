"""How long the first filter of a new pod shape takes in-process: one engine shape judged from nothing.

The extender's first request for a shape judges every node (`Engine.shape` after a `reset`). This runs that
pass alone, in one process, on bench/extender.py's cluster (N nodes x 8 A100-40GB GPUs, 10 resident pods
per GPU of 20/50/80/100 milli, so nearly every node state is distinct), for the bench's three new shapes
(100/250/500 milli) under the default policy, and reports CPU time (time.process_time, so the other
builds on a shared machine count less): the medians of --runs passes per shape, with the node views
already built (a new shape in a live extender) and the one-off cost of building the views (a fresh process).
Three ways per shape: `fresh_rows`, an engine that has read no node's rows yet; `shared_rows`, a fresh
engine whose rows another shape's pass read (the extender reads them at Ready); `one_engine`, one engine
judging the three shapes in turn as a live extender does, prepared as at Ready, with --changed nodes
taking a 20-milli pod between two shapes (the pods bound meanwhile): each pass reuses what was worked out
before (at Ready, or by the previous pass) of the nodes that did not change.

Usage: .venv/bin/python bench/firstcall.py [--nodes 1000,5000] [--runs 3] [--changed 50] [--label after]
       [--out bench/results/firstcall.json]
Results go under `--label` in --out, next to the other labels there: the "before" figures come from this
script run on the commit before the array pass (`git archive <commit> | tar -x -C DIR`, copy this script
into DIR/bench, run it from this checkout's venv with --label before).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core.explain import reason_text  # noqa: E402
from app.core.model import Allocation, Demand, Node  # noqa: E402
from app.core.placement import TargetWorkload, default_workload, registry  # noqa: E402
from app.core.placement.engine import Engine, RefusalStanding  # noqa: E402
from bench.extender import build_cache  # noqa: E402

SHAPES = (100, 250, 500)


def took_a_pod(node: Node, rng: random.Random) -> Node:
    """`node` after a 20-milli pod landed on one of its GPUs with room for it."""
    g = rng.choice([g for g in node.gpus if g.milli_used <= 980])
    return node.reserve((Allocation(node.name, (g.index,), (), 20, 20 * g.memory_mib // 1000),))


def prepare_at_ready(engine: Engine) -> None:
    """What Rankings.prepare does at Ready once the views exist (the code before `Engine.prepare` read
    the array form's rows alone)."""
    if hasattr(engine, "prepare"):
        engine.prepare()
    elif engine.array is not None:
        for node in engine.nodes:
            if node is not None:
                engine.read(node)


def one_engine(nodes: list[Node | None], policy_name: str, changed: int, seed: int) -> list[float]:
    """CPU ms of each shape's first pass on one engine, `changed` nodes taking a pod between shapes."""
    rng = random.Random(seed)
    nodes = list(nodes)
    policy = registry.create(policy_name, TargetWorkload(default_workload().shapes))
    engine = Engine(policy, RefusalStanding(reason_text))
    engine.reset(nodes)
    prepare_at_ready(engine)
    out = []
    for k, milli in enumerate(SHAPES):
        if k:
            for i in rng.sample(range(len(nodes)), changed):
                node = nodes[i]
                if node is not None:
                    nodes[i] = took_a_pod(node, rng)
                    engine.set(i, nodes[i])
        t1 = time.process_time()
        engine.shape(Demand(1, milli=milli))
        out.append((time.process_time() - t1) * 1e3)
    return out


def measure(n_nodes: int, runs: int, policy_name: str, changed: int) -> dict[str, Any]:
    cache, _ = build_cache(n_nodes, random.Random(7))
    t0 = time.process_time()
    frame = cache.frame(None)  # builds every node's view (a fresh process's first request does this)
    views_ms = (time.process_time() - t0) * 1e3
    gc.freeze()  # as the extender does once synced (extender.runtime.settle_heap)
    per_shape: dict[str, dict[str, float]] = {}
    fitting: dict[str, int] = {}
    order = sorted(frame.rank, key=frame.rank.__getitem__)
    nodes = [frame.changed.get(name) for name in order]
    # What Rankings.prepare does at Ready besides building the views.
    warm = Engine(registry.create(policy_name))
    warm.reset(nodes)
    t0 = time.process_time()
    prepare_at_ready(warm)
    prepare_ms = round((time.process_time() - t0) * 1e3, 1)
    for milli in SHAPES:
        demand = Demand(1, milli=milli)
        times: dict[str, list[float]] = {"fresh_rows": [], "shared_rows": []}
        for _ in range(runs):
            for key, samples in times.items():
                # A fresh workload: no fragmentation memo left from the previous run or shape.
                policy = registry.create(policy_name, TargetWorkload(default_workload().shapes))
                engine = Engine(policy, RefusalStanding(reason_text))
                if key == "shared_rows" and engine.array is not None:  # another shape's pass read them
                    for node in nodes:
                        if node is not None:
                            engine.read(node)
                engine.reset(nodes)
                t1 = time.process_time()
                shape = engine.shape(demand)
                samples.append((time.process_time() - t1) * 1e3)
        per_shape[str(milli)] = {k: round(statistics.median(v), 2) for k, v in times.items()}
        fitting[str(milli)] = sum(v is not None for v in shape.verdicts) - len(shape.refused)
    in_turn = [one_engine(nodes, policy_name, changed, seed) for seed in range(runs)]
    for k, milli in enumerate(SHAPES):
        per_shape[str(milli)]["one_engine"] = round(statistics.median(run[k] for run in in_turn), 2)
    return {
        "nodes": n_nodes,
        "policy": policy_name,
        "runs": runs,
        "changed_between_shapes": changed,
        "build_views_cpu_ms": round(views_ms, 1),
        "prepare_at_ready_cpu_ms": prepare_ms,
        "first_pass_cpu_ms_median": per_shape,
        "fitting_nodes": fitting,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="1000,5000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--label", default="after", help="key of these results in --out")
    ap.add_argument("--policy", default="fragaware")
    ap.add_argument("--changed", type=int, default=50, help="nodes that take a pod between two shapes")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "firstcall.json"))
    args = ap.parse_args()
    results = [measure(int(n), args.runs, args.policy, args.changed) for n in args.nodes.split(",")]
    run = {
        "command": " ".join([".venv/bin/python", "bench/firstcall.py", *sys.argv[1:]]),
        "python": platform.python_version(),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "results": results,
    }
    print(json.dumps(run, indent=2))
    path = Path(args.out)
    out = json.loads(path.read_text()) if path.exists() else {"what": __doc__.split("\n")[0]}
    out[args.label] = run
    path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
