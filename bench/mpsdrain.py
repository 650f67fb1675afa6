"""What the agent spends draining N MPS containers stopped at once: listings shared, or one per stop.

The agent's drain (agent/mpsdaemon/drain.py) runs in threads, one per stop, as the node server runs them.
`shared`: one ClientLists for all stops, as the agent has it; `per_stop`: a ClientLists of its own for each
stop, so each asks the daemon for its own listings (how the drain worked before the listings were shared).
Two cases: containers with one busy MPS client each (each drain ends it, then waits until no server lists
it), and containers with no client (a CPU-only process of a GPU pod, or a GPU pod not using CUDA yet: the
drain only lists). The two ways alternate, --runs times each, on one stand-in daemon (-M).

Per run: wall time from the stops to the last drain's answer, the CPU time of the control-binary runs
(RUSAGE_CHILDREN: what the agent waits for) and how many times the control binary ran. The daemon and the
control binary are the STAND-IN (tests/standin/mps_control.py, a Python process per command); NVIDIA's
binary is native, so its per-run cost is lower (UNVERIFIED on a GPU), and the saving is in the count of runs.

Run (under the machine's bench lock):
  flock /tmp/gpupack-bench.lock .venv/bin/python bench/mpsdrain.py --stops 30 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.mpsdaemon.drain import ClientLists, Drained, drain  # noqa: E402
from agent.mpsdaemon.mpscontrol import Control  # noqa: E402

STANDIN = REPO / "tests/standin/mps_control.py"
TIMEOUT_S = 30.0  # the drain's timeout: long enough that every drain here finishes
# The control binary as the agent runs it, counting its runs (one line per run).
COUNTING = '#!/bin/sh\necho >> "{count}"\nexec "{python}" "{standin}" "$@"\n'
WAYS = ("shared", "per_stop")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(control: Control, count: Path, pids: list[int], way: str) -> dict[str, float]:
    """Drain every pid's container at once; what it took."""
    shared = ClientLists(control)
    lists = [shared if way == "shared" else ClientLists(control) for _ in pids]
    done: list[Drained] = []
    go = threading.Barrier(len(pids) + 1)

    def stop(i: int) -> None:
        go.wait()
        done.append(drain(lists[i], [pids[i]], TIMEOUT_S))

    threads = [threading.Thread(target=stop, args=(i,)) for i in range(len(pids))]
    for t in threads:
        t.start()
    count.write_text("")
    cpu0 = children_cpu_s()
    go.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    failed = [d for d in done if not d.complete]
    if failed:
        raise RuntimeError(f"{way}: {len(failed)} drains did not finish: {failed[0].problem}")
    return {
        "wall_ms": round(wall * 1000, 1),
        "control_cpu_ms": round((children_cpu_s() - cpu0) * 1000, 1),
        "control_runs": len(count.read_text().splitlines()),
        "ended": sum(len(d.ended) for d in done),
    }


def busy_clients(env: dict[str, str], n: int) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, str(STANDIN), "client", "--work", "600"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line.startswith("server "):
            raise RuntimeError(f"stand-in client did not attach: {line!r}")
    return procs


def summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]} | {"runs": runs}


def measure(control: Control, count: Path, env: dict[str, str], stops: int, runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case in ("one_busy_client_each", "no_client"):
        results: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
        for r in range(runs):
            for way in WAYS if r % 2 == 0 else WAYS[::-1]:  # alternating: neither way always goes first
                procs = busy_clients(env, stops) if case == "one_busy_client_each" else []
                pids = [p.pid for p in procs] or [os.getpid()] * stops
                try:
                    results[way].append(one_run(control, count, pids, way))
                finally:
                    for p in procs:
                        p.send_signal(signal.SIGKILL)
                        p.wait(30)
                print(f"{case} run {r + 1}/{runs} {way}: {results[way][-1]}", file=sys.stderr, flush=True)
        medians = {way: summary(results[way]) for way in WAYS}
        out[case] = medians | {
            "per_stop_over_shared": {
                k: round(medians["per_stop"][k] / medians["shared"][k], 2)
                for k in ("wall_ms", "control_cpu_ms", "control_runs")
                if medians["shared"][k]
            }
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--stops", type=int, default=30, help="containers stopped at once")
    ap.add_argument("--runs", type=int, default=5, help="runs of each way, alternating")
    ap.add_argument("--out", default=str(REPO / "bench/results/mpsdrain.json"))
    args = ap.parse_args()
    command = " ".join(["bench/mpsdrain.py", *sys.argv[1:]])
    loadavg_at_start = [round(x, 2) for x in os.getloadavg()]
    where = Path(tempfile.mkdtemp(prefix="gpupack-mpsdrain-", dir="/tmp"))
    pipe = where / "pipe"
    pipe.mkdir()
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(pipe))
    binary, count = where / "nvidia-cuda-mps-control", where / "runs"
    binary.write_text(COUNTING.format(count=count, python=sys.executable, standin=STANDIN))
    binary.chmod(0o755)
    subprocess.run([sys.executable, str(STANDIN), "-d", "-M"], env=env, check=True, timeout=30)
    try:
        results = measure(Control(str(binary), pipe, TIMEOUT_S), count, env, args.stops, args.runs)
    finally:
        subprocess.run([sys.executable, str(STANDIN)], input="quit\n", env=env, text=True, timeout=30,
                       capture_output=True, check=False)  # fmt: skip
        shutil.rmtree(where, ignore_errors=True)
    doc = {
        "bench": "mpsdrain",
        "command": command,
        "machine": {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform()},
        "inputs": {
            "stops": args.stops,
            "runs": args.runs,
            "daemon": "STAND-IN tests/standin/mps_control.py -M",
        },
        "loadavg_at_start": loadavg_at_start,
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "results": results,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({case: r["per_stop_over_shared"] for case, r in results.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
