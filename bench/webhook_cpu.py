"""The webhook's own CPU per review, in process: this tree against an earlier commit, taking turns.

Each run starts a fresh Python process that builds the webhook's app (`webhook.main.create_app`, JSON log
lines to /dev/null), sends it --warmup reviews, then --requests more through its ASGI entry (no server,
no TLS: what is left is the webhook's own per-review Python: reading and validating the review, the
mutation, the log line and metrics), and reports the process CPU time per review. The two trees take
turns (the order flips each round) and each round's new ÷ old ratio is kept, so a load that changes over
the sitting moves both sides of a ratio alike; `summary` has the medians. The body is bench/webhook.py's
review, the same each time as a workload's replicas send it; with --distinct each review is a kind of pod
not seen before (its GPU container named anew), so the webhook's tables per kind of pod never help. The
earlier tree is `git archive --against` unpacked in a temporary directory.
Writes bench/results/webhook_cpu.json, or webhook_cpu_distinct.json with --distinct (--out: elsewhere).

    flock /tmp/gpupack-bench.lock .venv/bin/python bench/webhook_cpu.py --against <commit> [--rounds 9] \
        [--distinct]
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.trees import commit_of, uncommitted, unpacked  # noqa: E402

OUT = REPO / "bench" / "results" / "webhook_cpu.json"
OUT_DISTINCT = REPO / "bench" / "results" / "webhook_cpu_distinct.json"

# Run in a fresh process with the tree to measure first on sys.path; prints CPU µs per review.
_MEASURE = r"""
import asyncio, logging, sys, time
sys.path.insert(0, sys.argv[1])
from bench.webhook import review_body
from app.core import log
log.setup("info")
logging.getLogger().handlers[0].stream = open(__import__("os").devnull, "w")
from webhook.main import create_app
from webhook.settings import Settings

app = create_app(Settings())
warmup, n, distinct = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
body = review_body(1)
if distinct:  # every review a kind of pod not seen before: the GPU container named anew each time
    import json
    review = json.loads(body)
    bodies = []
    for i in range(warmup + n):
        review["request"]["object"]["spec"]["containers"][0]["name"] = f"trainer-{i}"
        bodies.append(json.dumps(review).encode())
else:
    bodies = [body] * (warmup + n)
sent = iter(bodies)
scope = {
    "type": "http", "method": "POST", "path": "/mutate", "raw_path": b"/mutate", "root_path": "",
    "query_string": b"", "http_version": "1.1", "scheme": "https", "asgi": {"version": "3.0"},
    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    "server": ("127.0.0.1", 8443), "client": ("127.0.0.1", 5555),
}

async def receive():
    return {"type": "http.request", "body": next(sent), "more_body": False}

async def send(message):
    pass

async def many(n):
    for _ in range(n):
        await app(dict(scope), receive, send)

loop = asyncio.new_event_loop()
loop.run_until_complete(many(warmup))
start = time.process_time()
loop.run_until_complete(many(n))
print((time.process_time() - start) / n * 1e6)
"""


def measure(tree: Path, warmup: int, requests: int, distinct: bool) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tree), str(warmup), str(requests), "1" if distinct else "0"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the earlier commit to compare with")
    parser.add_argument("--rounds", type=int, default=9, help="rounds, each measuring both trees once")
    parser.add_argument("--requests", type=int, default=3000, help="measured reviews per run")
    parser.add_argument("--warmup", type=int, default=500, help="unmeasured reviews first, per run")
    parser.add_argument(
        "--distinct",
        action="store_true",
        help="every review a kind of pod not seen before (its GPU container named anew), so nothing the "
        "webhook keeps per kind of pod is reused; default: the same review each time (a workload's "
        "replicas)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"default: {OUT.relative_to(REPO)}, or {OUT_DISTINCT.relative_to(REPO)} with --distinct",
    )
    args = parser.parse_args()
    out = args.out or (OUT_DISTINCT if args.distinct else OUT)
    old_commit = commit_of(args.against)
    dirty = uncommitted("app", "webhook", "bench/webhook.py")
    load_at_start = os.getloadavg()
    old_us: list[float] = []
    new_us: list[float] = []
    ratios: list[float] = []
    with unpacked(old_commit, "webhook-cpu-") as old_tree:
        for i in range(args.rounds):
            got: dict[str, float] = {}
            for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
                got[side] = measure(
                    old_tree if side == "old" else REPO, args.warmup, args.requests, args.distinct
                )
            old_us.append(got["old"])
            new_us.append(got["new"])
            ratios.append(got["new"] / got["old"])
            print(f"round {i + 1}: old {got['old']:.1f} µs, new {got['new']:.1f} µs, ratio {ratios[-1]:.3f}")
    result = {
        "question": "the webhook's own CPU per review (in process, no server or TLS): this tree vs a commit",
        "command": "flock /tmp/gpupack-bench.lock .venv/bin/python bench/webhook_cpu.py "
        + " ".join(sys.argv[1:]),
        "inputs": {
            "old_commit": old_commit,
            "new_commit": commit_of("HEAD"),
            "new_code_has_uncommitted_changes": dirty,  # app/, webhook/, the review
            "rounds": args.rounds,
            "requests_per_run": args.requests,
            "warmup_per_run": args.warmup,
            "review": "bench/webhook.py review_body: gpu-fraction 0.25 x 2, gpu-model, 2 containers + 1 init",
            "distinct_kinds": args.distinct,  # each review's GPU container named anew (a new kind of pod)
            "host": {
                "cpus": os.cpu_count(),
                "loadavg_at_start": load_at_start,
                "loadavg_at_end": os.getloadavg(),
                "platform": platform.platform(),
                "python": platform.python_version(),
            },
        },
        "summary": {
            "median_old_cpu_us_per_review": round(statistics.median(old_us), 1),
            "median_new_cpu_us_per_review": round(statistics.median(new_us), 1),
            "median_ratio_new_over_old": round(statistics.median(ratios), 3),
        },
        "results": {
            "old_cpu_us_per_review": [round(v, 1) for v in old_us],
            "new_cpu_us_per_review": [round(v, 1) for v in new_us],
            "ratio_new_over_old": [round(v, 3) for v in ratios],
        },
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
