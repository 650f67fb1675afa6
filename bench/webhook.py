"""How fast is POST /mutate over HTTPS? p50/p99 latency and throughput at 1, 16 and 64 concurrent clients.

Starts `gpupack webhook serve --workers N` for each N of --workers, as subprocesses on 127.0.0.1 with a
fresh CA (as deployed: N worker processes, uvloop + httptools, one JSON log line per review), and drives
them with bench/loadgen, a small Go load generator (built once per source and Go version by
bench/loadgen/build.sh): one keep-alive TLS connection per client, requests pre-encoded, so the client
costs a fraction of the server's CPU on the cores they share (both are recorded per request, with the CPU
count and the load). Each cell (mode, clients, workers) is bounded by a request count and a wall-clock
limit and run --runs times, the servers taking turns; `summary` has the medians. Beside them, in the
same runs, a reference server (bench/echo_server.py: bare uvicorn + the same TLS, the same client and body,
one fixed AdmissionReview back; --no-echo leaves it out): `vs_echo` has, per cell, the medians over the
runs of the webhook's server CPU per review, the echo's, their ratio and their difference (what the
webhook's own per-review Python costs). Two modes:
- closed loop (saturation): each client sends its next request as soon as the last one returns;
- paced (--rate, requests/s over all clients): sends are scheduled at a fixed total rate, and latency is
  measured from the *scheduled* send time, so a stalled server is not hidden (no coordinated omission).
  This is closer to an apiserver, which calls us once per pod create, not in a tight loop.
Writes bench/results/webhook.json (--out to write elsewhere).

    flock /tmp/gpupack-bench.lock .venv/bin/python bench/webhook.py [--workers 1,2] [--runs 3] \
        [--levels 1,16,64] [--seconds 10] [--rate 200] [--no-echo] [--out bench/results/webhook.json]
"""

from __future__ import annotations

import argparse
import http.client
import importlib.metadata
import json
import os
import platform
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.service import certs  # noqa: E402

OUT = REPO / "bench" / "results" / "webhook.json"


def review_body(uid: int) -> bytes:
    """A typical GPU pod: fraction, 2 devices, two containers, one init container, user env and affinity."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "train-",
            "namespace": "ml",
            "labels": {"app": "train"},
            "annotations": {
                "gpu-fraction": "0.25",
                "gpu-fraction-num-devices": "2",
                "gpupack.io/gpu-model": "A100-40GB",
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "env": [{"name": "EPOCHS", "value": "10"}],
                    "resources": {"requests": {"cpu": "4", "memory": "16Gi"}},
                },
                {"name": "sidecar", "image": "busybox"},
            ],
            "initContainers": [{"name": "fetch", "image": "busybox"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                        ]
                    }
                }
            },
        },
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"bench-{uid}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "ml",
            "object": pod,
        },
    }
    return json.dumps(review).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


ECHO = "echo"  # the reference server's label; the webhook's are "workers-N"


def start_server(workdir: Path, port: int, label: str) -> subprocess.Popen[bytes]:
    """`gpupack webhook serve --workers N` for "workers-N", bench/echo_server.py for ECHO."""
    certs.write_bundle(workdir, ["localhost"], ["127.0.0.1"])
    tls = ["--cert", str(workdir / "tls.crt"), "--key", str(workdir / "tls.key")]
    listen = ["--host", "127.0.0.1", "--port", str(port)]
    if label == ECHO:
        argv = [sys.executable, str(REPO / "bench" / "echo_server.py"), *tls, *listen]
    else:
        workers = label.removeprefix("workers-")
        argv = [sys.executable, "-m", "app.cli", "webhook", "serve", *tls, *listen, "--workers", workers]
    log = (workdir / "server.log").open("wb")
    return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=log, start_new_session=True)


def tls_context(workdir: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(workdir / "ca.crt"))


def wait_healthy(port: int, ctx: ssl.SSLContext, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("server not healthy in time")


def server_seconds(port: int, ctx: ssl.SSLContext) -> tuple[float, float]:
    """(sum, count) of the server's own review-duration histogram: time inside the handler ((0, 0) for
    the echo, which has none)."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    values = dict.fromkeys(
        ("gpupack_webhook_review_duration_seconds_sum", "gpupack_webhook_review_duration_seconds_count"), 0.0
    )
    for line in text.splitlines():
        for name in (
            "gpupack_webhook_review_duration_seconds_sum",
            "gpupack_webhook_review_duration_seconds_count",
        ):
            if line.startswith(name + " "):
                values[name] = float(line.split()[1])
    return values["gpupack_webhook_review_duration_seconds_sum"], values[
        "gpupack_webhook_review_duration_seconds_count"
    ]


def loadgen() -> str:
    """The Go load generator's binary (built once per source and Go version by bench/loadgen/build.sh)."""
    out = subprocess.run(
        [str(REPO / "bench" / "loadgen" / "build.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return out.stdout.strip().splitlines()[-1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the server process and of its live children (the worker processes)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid] + [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for p in pids:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def run_level(
    tool: str,
    workdir: Path,
    port: int,
    proc: subprocess.Popen[bytes],
    *,
    clients: int,
    total: int,
    seconds: float,
    rate: float | None = None,
) -> dict[str, Any]:
    bodies = workdir / "bodies.jsonl"
    if not bodies.exists():
        bodies.write_bytes(b"\n".join(review_body(i) for i in range(64)) + b"\n")
    argv = [tool, "-addr", f"127.0.0.1:{port}", "-path", "/mutate", "-health", "/healthz"]
    argv += ["-ca", str(workdir / "ca.crt")]
    argv += ["-bodies", str(bodies), "-clients", str(clients), "-requests", str(total)]
    argv += ["-seconds", str(seconds), "-rate", str(rate or 0)]
    ctx = tls_context(workdir)
    srv_sum0, srv_n0 = server_seconds(port, ctx)
    cpu0 = cpu_seconds(proc.pid)
    out = json.loads(subprocess.run(argv, check=True, stdout=subprocess.PIPE).stdout)
    server_cpu = cpu_seconds(proc.pid) - cpu0
    srv_sum1, srv_n1 = server_seconds(port, ctx)
    ms = sorted(us / 1000 for us in out["latencies_us"])
    wall = out["wall_seconds"]

    def pct(p: float) -> float:
        return round(ms[min(len(ms) - 1, int(p / 100 * len(ms)))], 3) if ms else float("nan")

    done = len(ms) + out["errors"]
    return {
        "clients": clients,
        "mode": "closed-loop" if rate is None else f"paced {rate:g} req/s total",
        "requests_ok": len(ms),
        "errors": out["errors"],
        "error_samples": out["error_samples"],
        "wall_seconds": round(wall, 3),
        "throughput_rps": round(len(ms) / wall, 1) if wall else 0.0,
        "latency_ms": {
            "p50": pct(50),
            "p90": pct(90),
            "p99": pct(99),
            "max": round(ms[-1], 3) if ms else None,
            "mean": round(statistics.fmean(ms), 3) if ms else None,
        },
        "server_handler_mean_ms": round((srv_sum1 - srv_sum0) / (srv_n1 - srv_n0) * 1000, 3)
        if srv_n1 > srv_n0
        else None,
        # CPU per request, server (all its processes) and client: what the 2 shared cores pay.
        "server_cpu_us_per_request": round(server_cpu / done * 1e6, 1) if done else None,
        "client_cpu_us_per_request": round(out["cpu_seconds"] / done * 1e6, 1) if done else None,
    }


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "openssl": ssl.OPENSSL_VERSION}
    for dist in ("gpupack", "fastapi", "starlette", "uvicorn", "pydantic", "h11", "prometheus-client"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each headline figure over repeated runs of one level."""
    return {
        "runs": len(runs),
        "throughput_rps": statistics.median(r["throughput_rps"] for r in runs),
        "p50_ms": statistics.median(r["latency_ms"]["p50"] for r in runs),
        "p99_ms": statistics.median(r["latency_ms"]["p99"] for r in runs),
        "server_cpu_us_per_request": statistics.median(r["server_cpu_us_per_request"] for r in runs),
        "client_cpu_us_per_request": statistics.median(r["client_cpu_us_per_request"] for r in runs),
    }


def against_echo(webhook: list[dict[str, Any]], echo: list[dict[str, Any]]) -> dict[str, Any]:
    """Server CPU per review, the webhook's beside the echo's, run by run (the same run's pairs): medians of
    each, of their ratio and of their difference."""
    pairs = [
        (w["server_cpu_us_per_request"], e["server_cpu_us_per_request"])
        for w, e in zip(webhook, echo, strict=True)
        if w["server_cpu_us_per_request"] and e["server_cpu_us_per_request"]
    ]
    if not pairs:
        return {"runs": 0}
    return {
        "runs": len(pairs),
        "webhook_server_cpu_us_per_request": statistics.median(w for w, _ in pairs),
        "echo_server_cpu_us_per_request": statistics.median(e for _, e in pairs),
        "ratio_webhook_to_echo": round(statistics.median(w / e for w, e in pairs), 2),
        "webhook_minus_echo_us": round(statistics.median(w - e for w, e in pairs), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--requests", type=int, default=20000, help="requests per concurrency level (upper bound)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="wall-clock limit per level")
    parser.add_argument("--levels", default="1,16,64", help="comma list of concurrent clients")
    parser.add_argument(
        "--workers", default="1,2", help="comma list of webhook worker counts (--workers), one server each"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each level; the summary has medians")
    parser.add_argument("--warmup", type=int, default=2000, help="unmeasured requests before the first level")
    parser.add_argument(
        "--rate", type=float, default=200.0, help="total req/s of the paced runs (0: skip them)"
    )
    parser.add_argument(
        "--echo",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the bare uvicorn + TLS echo server beside the webhook, as a reference row",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    worker_counts = [int(x) for x in args.workers.split(",")]
    labels = [f"workers-{n}" for n in worker_counts] + ([ECHO] if args.echo else [])
    load_at_start = os.getloadavg()
    tool = loadgen()

    # One server per worker count (and the echo), all started up front; every (mode, clients) cell is run
    # on each server in turn, run after run, so a burst of load from elsewhere on the machine hits them
    # all alike.
    with tempfile.TemporaryDirectory(prefix="gpupack-bench-") as tmp:
        servers: dict[str, tuple[Path, int, subprocess.Popen[bytes]]] = {}
        try:
            for label in labels:
                workdir = Path(tmp) / label
                workdir.mkdir()
                port = free_port()
                servers[label] = (workdir, port, start_server(workdir, port, label))
                wait_healthy(port, tls_context(workdir), servers[label][2])
                run_level(tool, *servers[label], clients=16, total=args.warmup, seconds=args.seconds)
            results, summary, vs_echo = [], [], []
            modes: list[float | None] = [None, args.rate] if args.rate else [None]
            for rate in modes:
                for clients in levels:
                    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
                    for _ in range(args.runs):
                        for label in labels:
                            res = {"server": label}
                            res |= run_level(
                                tool,
                                *servers[label],
                                clients=clients,
                                total=args.requests,
                                seconds=args.seconds,
                                rate=rate,
                            )
                            print(json.dumps(res), file=sys.stderr)
                            runs[label].append(res)
                    for label in labels:
                        results += runs[label]
                        cell = {"server": label, "clients": clients, "mode": runs[label][0]["mode"]}
                        summary.append(cell | median_of(runs[label]))
                        if label != ECHO and args.echo:
                            vs_echo.append(cell | against_echo(runs[label], runs[ECHO]))
        finally:
            for _, _, proc in servers.values():
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    report = {
        "question": "latency and throughput of POST /mutate over HTTPS, by worker processes",
        "inputs": {
            "levels": levels,
            "workers": worker_counts,
            "echo_reference": args.echo,
            "runs_per_level": args.runs,
            "paced_rate_rps": args.rate or None,
            "requests_per_level": args.requests,
            "seconds_limit_per_level": args.seconds,
            "warmup_requests": args.warmup,
            "body_bytes": len(review_body(0)),
            "review": "gpu-fraction 0.25 x 2 GPUs, gpu-model, 2 containers + 1 init, env, node affinity",
            "client": "bench/loadgen (Go, crypto/tls + minimal HTTP/1.1): one keep-alive TLS connection per "
            "client goroutine, requests pre-encoded; handshakes before the measured window, as the apiserver "
            "keeps its connections",
            "host": {
                "cpus": os.cpu_count(),
                "loadavg_at_start": load_at_start,
                "loadavg_at_end": os.getloadavg(),
                "platform": platform.platform(),
                "go": subprocess.run(
                    ["go", "version"], check=True, stdout=subprocess.PIPE, text=True
                ).stdout.strip(),
            },
        },
        "versions": versions(),
        "summary": summary,
        "vs_echo": vs_echo,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=1), file=sys.stderr)
    print(json.dumps(vs_echo, indent=1), file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
