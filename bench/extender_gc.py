"""The garbage collector in the extender's warm path: this tree against an earlier commit, taking turns.

A warm filter+prioritize pair at 5 000 nodes takes under 2 ms, and its tail is the collector: a collection
of the middle generation walks every object that survived the young collections since the last one. This
bench counts them. Each run is a fresh process on one tree: bench/extender.py's cluster (N nodes x 8 GPUs,
10 resident pods per GPU) and extender (prepared as at Ready, the heap frozen, served by uvicorn over one
keep-alive connection); --warmup pairs, then --pairs timed pairs (filter and prioritize timed as
bench/extender.py times them; then the chosen node takes the pod, as the watch delivers a bind) with every
collection timed through `gc.callbacks` (a pair a collection of an older generation landed in is listed
with its time), then --pairs more with the collector off to count what one pair leaves behind:

- `tracked_per_pair`: objects the collector tracks, allocated less freed, per pair (what fills the young
  generation: 700 of them start a young collection, ten young ones a middle one);
- `live_per_pair`: objects still there after a full collection (what the next middle collection walks).

The two trees take turns (the order flips each round); `summary` has the medians of the rounds and each
round's new / old ratios. The earlier tree is `git archive --against` unpacked in a temporary directory.
Writes bench/results/extender_gc.json (--out: elsewhere).

    flock /tmp/gpupack-bench.lock .venv/bin/python bench/extender_gc.py --against <commit> [--nodes 5000] \
        [--pairs 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.trees import commit_of, uncommitted, unpacked  # noqa: E402

OUT = REPO / "bench" / "results" / "extender_gc.json"

# Run in a fresh process with the tree to measure first on sys.path; prints one JSON line.
_MEASURE = r"""
import gc, json, random, sys, time
sys.path.insert(0, sys.argv[1])
n_nodes, warmup, pairs = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
from bench.extender import _assume_bound, _encode, _NoKube, _served, build_cache, pod_obj
from app.core.placement import registry
from extender.binder import Binder
from extender.config import Settings
from extender.main import create_app
from extender.runtime import settle_heap
from tests.static_runtime import StaticRuntime

cache, node_names = build_cache(n_nodes, random.Random(7))
settings = Settings()
policy = registry.create(settings.policy)
rt = StaticRuntime(cache, policy, Binder(_NoKube(), cache, policy))
rt.rankings.prepare()
settle_heap()
pauses = []  # (generation, ms, objects collected)
started = [0.0]

def timed(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        pauses.append((info["generation"], (time.perf_counter() - started[0]) * 1e3))

with _served(create_app(settings, runtime=rt)) as post:
    def pair(i):
        # Timed as bench/extender.py times a warm pair: the two calls, not encoding their bodies (kube-
        # scheduler does that in Go) nor the bind's watch echo.
        pod = pod_obj(f"gc-{i}", (100, 250, 500)[i % 3])
        body = _encode(pod, node_names)
        t0 = time.perf_counter()
        ok = post("/filter", body)["NodeNames"]
        took = time.perf_counter() - t0
        body = _encode(pod, ok)
        t0 = time.perf_counter()
        post("/prioritize", body)
        took += time.perf_counter() - t0
        _assume_bound(cache, policy, pod, ok[0])
        return took * 1e3

    for i in range(warmup):
        pair(i)
    gc.collect()
    settle_heap()
    gc.callbacks.append(timed)
    pair_ms, hit = [], []
    for i in range(warmup, warmup + pairs):
        before = len(pauses)
        pair_ms.append(pair(i))
        hit.append(max((g for g, _ in pauses[before:]), default=-1))
    gc.callbacks.remove(timed)
    gc.collect()
    settle_heap()
    gc.disable()
    count0 = gc.get_count()[0]
    for i in range(warmup + pairs, warmup + 2 * pairs):
        pair(i)
    tracked = (gc.get_count()[0] - count0) / pairs
    gc.enable()
    gc.collect()
    live = sum(len(gc.get_objects(g)) for g in (0, 1, 2)) / pairs

def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] if s else 0.0

by_gen = {}
for g in (0, 1, 2):
    ms = [m for gen, m in pauses if gen == g]
    by_gen[str(g)] = {"collections": len(ms), "mean_ms": sum(ms) / len(ms) if ms else 0.0,
                      "max_ms": max(ms, default=0.0)}
print(json.dumps({
    "pair_p50_ms": pct(pair_ms, 0.5), "pair_p99_ms": pct(pair_ms, 0.99), "pair_max_ms": max(pair_ms),
    "pair_p50_without_older_collections_ms": pct([m for m, h in zip(pair_ms, hit) if h < 1], 0.5),
    "pairs_with_an_older_collection_ms": sorted(round(m, 2) for m, h in zip(pair_ms, hit) if h >= 1),
    "collections": by_gen, "tracked_per_pair": tracked, "live_per_pair": live,
}))
"""

FIGURES = ("pair_p50_ms", "pair_p99_ms", "tracked_per_pair", "live_per_pair")


def measure(tree: Path, nodes: int, warmup: int, pairs: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tree), str(nodes), str(warmup), str(pairs)],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(float(r[key]) for r in runs), 2)


def _gen_median(runs: list[dict[str, Any]], gen: str, key: str) -> float:
    return round(statistics.median(float(r["collections"][gen][key]) for r in runs), 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the earlier commit to compare with")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pairs", type=int, default=300, help="timed pairs per run (and as many counted)")
    parser.add_argument("--warmup", type=int, default=30, help="pairs first, untimed")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each measuring both trees once")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    old_commit = commit_of(args.against)
    dirty = uncommitted("app", "extender", "bench/extender.py")
    load_at_start = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    ratios: dict[str, list[float]] = {k: [] for k in FIGURES}
    with unpacked(old_commit, "extender-gc-") as old_tree:
        for i in range(args.rounds):
            got: dict[str, dict[str, Any]] = {}
            for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
                tree = old_tree if side == "old" else REPO
                got[side] = measure(tree, args.nodes, args.warmup, args.pairs)
                runs[side].append(got[side])
                print(
                    f"round {i + 1} {side}: pair p50 {got[side]['pair_p50_ms']:.2f} ms, p99 "
                    f"{got[side]['pair_p99_ms']:.2f} ms; tracked {got[side]['tracked_per_pair']:.1f}, live "
                    f"{got[side]['live_per_pair']:.1f} objects a pair; middle-generation collections "
                    f"{got[side]['collections']['1']['collections']}",
                    flush=True,
                )
            for key in FIGURES:
                ratios[key].append(got["new"][key] / got["old"][key])
    summary: dict[str, Any] = {}
    for side, side_runs in runs.items():
        summary[side] = {key: _median(side_runs, key) for key in FIGURES} | {
            f"gen{g}_{k}": _gen_median(side_runs, g, k)
            for g in ("0", "1", "2")
            for k in ("collections", "mean_ms", "max_ms")
        }
    summary["new_over_old"] = {key: round(statistics.median(v), 3) for key, v in ratios.items()}
    result = {
        "question": "what the garbage collector does in the extender's warm pairs: this tree vs a commit",
        "command": "flock /tmp/gpupack-bench.lock .venv/bin/python bench/extender_gc.py "
        + " ".join(sys.argv[1:]),
        "inputs": {
            "old_commit": old_commit,
            "new_commit": commit_of("HEAD"),
            "new_code_has_uncommitted_changes": dirty,  # app/, extender/, the bench's cluster
            "nodes": args.nodes,
            "pairs_per_run": args.pairs,
            "warmup_per_run": args.warmup,
            "rounds": args.rounds,
            "host": {
                "cpus": os.cpu_count(),
                "loadavg_at_start": load_at_start,
                "loadavg_at_end": os.getloadavg(),
                "platform": platform.platform(),
                "python": platform.python_version(),
            },
        },
        "summary": summary,
        "results": runs,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
