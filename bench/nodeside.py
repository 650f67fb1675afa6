"""What gpupack's node side adds to a pod's start and stop, on a real kubelet + containerd node (root).

The real-node tier's cluster (tests/realnode/chart.py: gpupack installed by its chart, a simulated r615
GPU pair, the STAND-IN MPS control daemon) runs three kinds of pod on the same node, interleaved:

- `mps`: a gpupack MPS share (`gpu-fraction`, isolation mps): gpupack's RuntimeClass handler asks the agent
  at create (the pod from the agent's watch of the node's pods, an apiserver read only where the watch has
  not shown it yet; the pod's MPS directory), its createRuntime hook sets per-cgroup limits, and a stop is
  drained through the MPS control daemon;
- `shared`: a gpupack share without MPS (isolation none): the node's default runtime (gpupack's guard, no
  agent call) keeps its allocation;
- `plain`: a pod with no GPU keys on the same node: the guard gives it `NVIDIA_VISIBLE_DEVICES=void`.

Per pod: create → bound (scheduled), bound → Running (what the node does: sandbox, handler, container) and
delete → gone (the stop: the handler's drain for `mps`, then the kubelet's kill and cleanup). Each pod's
container exits on SIGTERM at once, so the stop measures the node, not a grace period. Times are the bench's
own clock polling the apiserver every 20 ms (a phase is seen up to 20 ms late, alike for every kind).
First one pod at a time (--pods of each kind, the kinds' order rotating from one pod to the next), then
--burst pods of one kind created at once and deleted at once, each kind in turn, for --burst-rounds rounds
whose order of kinds rotates too, so no kind always runs first or last.

Beside the wall clock, the CPU time of gpupack's node-side processes (the agent with the control-binary runs
it waited for, and the MPS control daemon), read from the host's /proc at each phase's ends: what the node
side spends on a pod, less exposed to the other work on the machine than its wall time. The machine's load
average is sampled once per pod (one at a time) and per burst.

Beside both, the agent's own timings from its /metrics (read before and after each phase of each pod one at
a time, and around each burst): how long it took to answer each question of the handler
(gpupack_agent_node_answer_seconds: `create`, the hook's `start`, `stop`, `delete`) and how long its periodic
cycles ran (gpupack_agent_cycle_seconds) while the pod started, and how many reads of a pod the agent made
and the apiserver's own time for them (from the apiserver's /metrics): a create answered from the agent's
watch makes none; for the slowest `mps` starts, each figure of that start side by side, so what a slow start
waited on can be read off.

The MPS daemon is the stand-in (a Python script per control command); NVIDIA's binary answers faster, so
the `mps` stop here bounds the real one from above (UNVERIFIED on a GPU).

Run (root, under the machine's bench lock):
  flock /tmp/gpupack-bench.lock .venv/bin/python bench/nodeside.py --pods 50 --burst 30 [--burst-rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from app.core import names  # noqa: E402
from app.core.errors import KubeError  # noqa: E402
from app.kube.calls import Request  # noqa: E402
from app.kube.client import Kube  # noqa: E402
from bench.quantiles import nearest_rank  # noqa: E402
from tests.devcluster import ensure_binaries, kubeletnode  # noqa: E402
from tests.realnode import chart  # noqa: E402

KINDS = {
    "mps": {names.GPU_FRACTION: "0.02", names.ISOLATION: "mps"},
    "shared": {names.GPU_FRACTION: "0.02", names.ISOLATION: "none"},
    "plain": {},
}
POLL_S = 0.02
TIMEOUT_S = 120.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# How the real node's gpupack processes are told apart from other gpupack processes on the machine (a dev
# cluster's simulated agents run on the host too): the argument only the chart's agent has, and the stand-in
# daemon's path in the image, in the foreground.
AGENT_MARK = ("agent", "run", "--proc-root=/host/proc")
DAEMON_MARK = ("/opt/gpupack-standin/nvidia-cuda-mps-control", "-f")
# Runs until SIGTERM, then exits at once (busybox sh: the trap runs between sleeps of 0.1 s).
COMMAND = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"]


def a_pod(name: str, kind: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(KINDS[kind])},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": kubeletnode.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": kubeletnode.BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": COMMAND,
                }
            ],
        },
    }


def running(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)


class NodeSideCpu:
    """CPU seconds gpupack's node-side processes on the real node have used: the agent (its own, and the
    control-binary runs it waited for) and the MPS control daemon. Found once by their command lines in the
    host's /proc (`pids`: those found; a process not found counts nothing, and the JSON says so)."""

    def __init__(self) -> None:
        found = {"agent": _find(AGENT_MARK), "mps_daemon": _find(DAEMON_MARK)}
        self.pids = {name: pid for name, pid in found.items() if pid is not None}

    def now(self) -> float:
        total = 0.0
        for pid in self.pids.values():
            with contextlib.suppress(OSError):  # gone (restarted): the JSON's figures then say too little
                total += _cpu_s(pid)
        return total


def _find(mark: tuple[str, ...]) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if all(m in argv for m in mark):
            return int(entry.name)
    return None


def _cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of `pid` (children once waited for), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / CLOCK_TICKS


ANSWERS = "gpupack_agent_node_answer_seconds"
CYCLES = "gpupack_agent_cycle_seconds"
QUESTIONS = ("create", "start", "stop", "delete")
APISERVER_READS = "apiserver_pod_reads"  # the apiserver's own time for the agent's reads of a pod
SLOWEST = 5  # the slowest `mps` starts one at a time, each with the agent's figures beside it


@dataclass(frozen=True)
class Histo:
    """One histogram series as scraped: cumulative counts by upper bound, its sum and count."""

    buckets: tuple[tuple[float, float], ...] = ()
    total_s: float = 0.0
    count: float = 0.0

    def minus(self, earlier: Histo) -> Histo:
        before = dict(earlier.buckets)
        return Histo(
            tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets),
            self.total_s - earlier.total_s,
            self.count - earlier.count,
        )

    def quantile_le_ms(self, q: float) -> float | None:
        """The upper bound (ms) of the bucket holding the q-quantile (nearest rank); None when empty or
        past the histogram's last bound."""
        if self.count <= 0:
            return None
        rank = max(1.0, q * self.count)
        for le, n in self.buckets:
            if n >= rank:
                return round(le * 1000, 1) if le != float("inf") else None  # past the last bucket
        return None


# One scrape of the agent: each question's answer times, and the cycle's.
Scrape = dict[str, Histo]


class AgentMetrics:
    """The real node's agent's /metrics, at its pod IP on the node's bridge (port 9400, the chart's)."""

    def __init__(self, kube: Kube) -> None:
        (agent,) = chart.pods(kube, "agent")
        self.kube = kube
        self.url = f"http://{agent['status']['podIP']}:9400/metrics"
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def read(self) -> Scrape:
        with self.opener.open(self.url, timeout=10) as resp:
            text = resp.read().decode()
        found: dict[str, dict[str, Any]] = {}
        found[APISERVER_READS] = self._apiserver_reads()
        for family in text_string_to_metric_families(text):
            if family.name not in (ANSWERS, CYCLES):
                continue
            for sample in family.samples:
                key = sample.labels.get("question", "cycle")
                one = found.setdefault(key, {"buckets": [], "sum": 0.0, "count": 0.0})
                if sample.name.endswith("_bucket"):
                    one["buckets"].append((float(sample.labels["le"]), sample.value))
                elif sample.name.endswith("_sum"):
                    one["sum"] = sample.value
                elif sample.name.endswith("_count"):
                    one["count"] = sample.value
        return {k: Histo(tuple(sorted(v["buckets"])), v["sum"], v["count"]) for k, v in found.items()}

    def _apiserver_reads(self) -> dict[str, Any]:
        """The apiserver's own time for namespaced pod lists (on this cluster only the agent's reads of a
        container's pod make them: the bench gets pods by name, the agent's cycle and its watch list
        cluster-wide), summed over the series' other labels: beside the agent's time for the same reads,
        what of a slow read the apiserver spent and what the path to it did."""
        buckets: dict[float, float] = {}
        one: dict[str, Any] = {"buckets": [], "sum": 0.0, "count": 0.0}
        want = ('verb="LIST"', 'resource="pods"', 'scope="namespace"')
        for line in self.kube.text("/metrics").splitlines():
            if not line.startswith("apiserver_request_duration_seconds_") or not all(w in line for w in want):
                continue
            name, value = line.rsplit(" ", 1)
            if name.startswith("apiserver_request_duration_seconds_bucket"):
                le = name.split('le="', 1)[1].split('"', 1)[0]
                bound = float("inf") if le == "+Inf" else float(le)
                buckets[bound] = buckets.get(bound, 0.0) + float(value)
            elif name.startswith("apiserver_request_duration_seconds_sum"):
                one["sum"] += float(value)
            elif name.startswith("apiserver_request_duration_seconds_count"):
                one["count"] += float(value)
        one["buckets"] = list(buckets.items())
        return one


def slow_answers(kube: Kube, over_s: float = 0.1, stop_over_s: float = 1.0) -> list[dict[str, Any]]:
    """The agent's log lines of answers that took over `over_s` (a stop: over `stop_over_s`, the goal for
    a drained stop), as logged, with its apiserver reads and their times."""
    (agent,) = chart.pods(kube, "agent")
    path = f"/api/v1/namespaces/{agent['metadata']['namespace']}/pods/{agent['metadata']['name']}/log"
    text = kube.text(path)
    out = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        limit = stop_over_s if entry.get("question") == "stop" else over_s
        if entry.get("msg") == "node-side answer" and entry.get("seconds", 0) > limit:
            out.append({k: v for k, v in entry.items() if k not in ("logger", "level", "reason")})
    return out


def delta(after: Scrape, before: Scrape) -> Scrape:
    return {k: h.minus(before.get(k, Histo())) for k, h in after.items()}


class Timer:
    """One pod's phases on the bench's clock."""

    def __init__(self, kube: Kube, namespace: str, name: str, kind: str) -> None:
        self.kube, self.path, self.kind = kube, f"/api/v1/namespaces/{namespace}/pods/{name}", kind
        self.t: dict[str, float] = {}

    def poll(self) -> bool:
        """One look at the pod; True once it is Running (or failed: raised)."""
        pod = self.kube.send(Request("GET", self.path))
        now = time.monotonic()
        if pod.get("spec", {}).get("nodeName"):
            self.t.setdefault("bound", now)
        for s in pod.get("status", {}).get("containerStatuses") or []:
            waiting = (s.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("CreateContainerError", "RunContainerError"):
                raise RuntimeError(f"{self.path}: {waiting.get('reason')}: {waiting.get('message')}")
        if running(pod):
            self.t.setdefault("running", now)
            return True
        return False

    def gone(self) -> bool:
        try:
            self.kube.send(Request("GET", self.path))
        except KubeError as exc:
            if exc.is_not_found:
                self.t.setdefault("gone", time.monotonic())
                return True
            raise
        return False


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(POLL_S)


@dataclass
class Round:
    """Pods started and stopped together: each pod's phases, the node side's CPU seconds while they started
    (create → all Running) and while they stopped (delete → all gone), the wall time until the last was
    gone, and the 1-minute load average when the round began."""

    timers: list[Timer]
    start_cpu_s: float
    stop_cpu_s: float
    all_gone_s: float
    loadavg_1m: float
    agent_start: Scrape  # the agent's answers and cycles from the create to the last pod Running
    agent_stop: Scrape  # the same from the delete to the last pod gone


def start_and_stop(
    kube: Kube,
    cpu: NodeSideCpu,
    agent: AgentMetrics,
    *,
    namespace: str,
    node: str,
    names_kinds: list[tuple[str, str]],
) -> Round:
    """Create the pods at once, wait until each runs, delete them at once, wait until each is gone."""
    load = os.getloadavg()[0]
    timers = [Timer(kube, namespace, n, k) for n, k in names_kinds]
    scraped0 = agent.read()
    cpu0 = cpu.now()
    for tm, (n, k) in zip(timers, names_kinds, strict=True):
        tm.t["created"] = time.monotonic()
        kube.send(Request("POST", f"/api/v1/namespaces/{namespace}/pods", a_pod(n, k, node)))
    until(lambda: all([tm.poll() for tm in timers if "running" not in tm.t] or [True]), "pods Running")
    cpu1 = cpu.now()
    scraped1 = agent.read()
    deleted = time.monotonic()
    for tm in timers:
        tm.t["deleted"] = time.monotonic()
        kube.send(Request("DELETE", tm.path))
    until(lambda: all([tm.gone() for tm in timers if "gone" not in tm.t] or [True]), "pods gone")
    all_gone = max(tm.t["gone"] for tm in timers) - deleted
    cpu2 = cpu.now()
    scraped2 = agent.read()
    return Round(
        timers, cpu1 - cpu0, cpu2 - cpu1, all_gone, load, delta(scraped1, scraped0), delta(scraped2, scraped1)
    )


def ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered) * 1000, 1),
        "p90": round(nearest_rank(ordered, 0.90) * 1000, 1),
        "p99": round(nearest_rank(ordered, 0.99) * 1000, 1),
        "n": len(ordered),
    }


def phases(timers: list[Timer]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind in KINDS:
        mine = [tm.t for tm in timers if tm.kind == kind]
        if not mine:
            continue
        out[kind] = {
            "create_to_bound_ms": ms([t["bound"] - t["created"] for t in mine]),
            "bound_to_running_ms": ms([t["running"] - t["bound"] for t in mine]),
            "delete_to_gone_ms": ms([t["gone"] - t["deleted"] for t in mine]),
        }
    return out


def added(by_kind: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """What each gpupack kind adds over `plain` on the node, each quantile of one kind minus the same
    quantile of `plain`: start (bound → Running), stop (delete → gone) and, where measured, the node side's
    CPU time."""
    out: dict[str, dict[str, float]] = {}
    for kind in ("mps", "shared"):
        for phase, quantiles in by_kind[kind].items():
            if phase == "create_to_bound_ms":  # the scheduler's, not the node's
                continue
            for q in ("p50", "p90", "p99"):
                if isinstance(quantiles, dict) and q in quantiles:  # not the list of rounds
                    out.setdefault(kind, {})[f"{phase.removesuffix('_ms')}_{q}_added_ms"] = round(
                        quantiles[q] - by_kind["plain"][phase][q], 1
                    )
    return out


def cpu_ms(rounds: list[tuple[str, Round]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per kind, the node side's CPU time per round: while its pods started, and while they stopped."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind in KINDS:
        mine = [r for k, r in rounds if k == kind]
        out[kind] = {
            "node_side_cpu_start_ms": ms([r.start_cpu_s for r in mine]),
            "node_side_cpu_stop_ms": ms([r.stop_cpu_s for r in mine]),
        }
    return out


def agent_one_at_a_time(one: list[tuple[str, Round]]) -> dict[str, Any]:
    """The agent's answer times per `mps` pod started and stopped alone (each round holds one pod, so the
    histogram's sum over the round is that pod's answer), the time its cycles ran during each start, and the
    slowest starts with every figure beside them."""
    mps = [r for k, r in one if k == "mps"]
    plain_p50 = statistics.median(
        tm.t["running"] - tm.t["bound"] for k, r in one if k == "plain" for tm in r.timers
    )
    out: dict[str, Any] = {
        f"answer_{q}_ms": ms([r.agent_stop[q].total_s if q in ("stop", "delete") else r.agent_start[q].total_s
                              for r in mps])
        for q in QUESTIONS
    }  # fmt: skip
    out["apiserver_pod_read_ms"] = ms([r.agent_start[APISERVER_READS].total_s for r in mps])
    out["starts_with_an_apiserver_pod_read"] = sum(1 for r in mps if r.agent_start[APISERVER_READS].count > 0)
    out["cycles_during_start_ms"] = ms([r.agent_start["cycle"].total_s for r in mps])
    out["cycle_ms_every_kind"] = histo_quantiles([r.agent_start["cycle"] for _, r in one])

    def took(r: Round) -> float:
        return r.timers[0].t["running"] - r.timers[0].t["bound"]

    out["slowest_starts"] = [
        {"pod": r.timers[0].path.rsplit("/", 1)[-1],
         "bound_to_running_ms": round(took(r) * 1000, 1),
         "over_plain_p50_ms": round((took(r) - plain_p50) * 1000, 1),
         "agent_create_ms": round(r.agent_start["create"].total_s * 1000, 1),
         "agent_start_ms": round(r.agent_start["start"].total_s * 1000, 1),
         "apiserver_pod_reads": int(r.agent_start[APISERVER_READS].count),
         "apiserver_pod_read_ms": round(r.agent_start[APISERVER_READS].total_s * 1000, 1),
         "agent_cycles": int(r.agent_start["cycle"].count),
         "agent_cycles_ms": round(r.agent_start["cycle"].total_s * 1000, 1),
         "node_side_cpu_ms": round(r.start_cpu_s * 1000, 1),
         "loadavg_1m": round(r.loadavg_1m, 2)}
        for r in sorted(mps, key=took, reverse=True)[:SLOWEST]
    ]  # fmt: skip
    return out


def histo_quantiles(parts: list[Histo]) -> dict[str, float | None]:
    """One histogram over several windows, from its buckets: each quantile as the upper
    bound of its bucket, the mean exactly."""
    whole = Histo()
    for h in parts:
        whole = Histo(
            tuple((le, n + dict(whole.buckets).get(le, 0.0)) for le, n in h.buckets),
            whole.total_s + h.total_s,
            whole.count + h.count,
        )
    return {
        "p50_le": whole.quantile_le_ms(0.5),
        "p99_le": whole.quantile_le_ms(0.99),
        "mean": round(whole.total_s / whole.count * 1000, 1) if whole.count else None,
        "n": int(whole.count),
    }


def agent_bursts(bursts: list[tuple[str, Round]]) -> dict[str, Any]:
    """Per kind of burst: the agent's answers by question over all its rounds (quantiles as bucket upper
    bounds, mean exact) and its cycles while the pods started and stopped."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        mine = [r for k, r in bursts if k == kind]
        if not mine:
            continue
        answers: dict[str, Any] = {}
        for q in QUESTIONS:
            phase = "agent_stop" if q in ("stop", "delete") else "agent_start"
            answers[q] = histo_quantiles([getattr(r, phase)[q] for r in mine])
        out[kind] = {
            "answer_ms": answers,
            "apiserver_pod_read_ms": histo_quantiles([r.agent_start[APISERVER_READS] for r in mine]),
            "cycle_ms": histo_quantiles(
                [r.agent_start["cycle"] for r in mine] + [r.agent_stop["cycle"] for r in mine]
            ),
        }
    return out


def rotated(i: int) -> list[str]:
    kinds = list(KINDS)
    return kinds[i % len(kinds) :] + kinds[: i % len(kinds)]


def measure(
    kube: Kube,
    cpu: NodeSideCpu,
    agent: AgentMetrics,
    node: str,
    *,
    pods: int,
    burst_size: int,
    burst_rounds: int,
) -> tuple[list[tuple[str, Round]], list[tuple[str, Round]]]:
    kube.send(Request("POST", "/api/v1/namespaces", {"metadata": {"name": "bench"}}))
    one: list[tuple[str, Round]] = []
    for i in range(pods):
        for kind in rotated(i):  # interleaved: machine noise falls on every kind alike
            one.append(
                (
                    kind,
                    start_and_stop(
                        kube, cpu, agent, namespace="bench", node=node, names_kinds=[(f"{kind}-{i}", kind)]
                    ),
                )
            )
        print(f"one at a time: {i + 1}/{pods} of each kind", file=sys.stderr, flush=True)
    bursts: list[tuple[str, Round]] = []
    for r in range(burst_rounds if burst_size > 0 else 0):  # --burst 0: one at a time only
        for kind in rotated(r):
            print(f"burst round {r + 1}/{burst_rounds}: {burst_size} {kind} pods at once", file=sys.stderr,
                  flush=True)  # fmt: skip
            pods_of = [(f"{kind}-burst-{r}-{i}", kind) for i in range(burst_size)]
            bursts.append(
                (kind, start_and_stop(kube, cpu, agent, namespace="bench", node=node, names_kinds=pods_of))
            )
    return one, bursts


def burst_summary(bursts: list[tuple[str, Round]]) -> dict[str, Any]:
    """Per kind: every pod's phases over all rounds, the node side's CPU per burst, the wall time from the
    burst's delete to its last pod gone, and each round as it ran."""
    by_kind: dict[str, Any] = phases([tm for _, r in bursts for tm in r.timers])
    cpu = cpu_ms(bursts)
    for kind in KINDS:
        mine = [r for k, r in bursts if k == kind]
        by_kind[kind] |= cpu[kind] | {"delete_to_all_gone_ms": ms([r.all_gone_s for r in mine])}
        by_kind[kind]["rounds"] = [
            {"position": [i for i, (k, _) in enumerate(bursts) if k == kind][j],
             "loadavg_1m": round(r.loadavg_1m, 2),
             "bound_to_running_p50_ms": ms([tm.t["running"] - tm.t["bound"] for tm in r.timers])["p50"],
             "delete_to_gone_p50_ms": ms([tm.t["gone"] - tm.t["deleted"] for tm in r.timers])["p50"],
             "delete_to_all_gone_ms": round(r.all_gone_s * 1000, 1),
             "node_side_cpu_stop_ms": round(r.stop_cpu_s * 1000, 1)}
            for j, r in enumerate(mine)
        ]  # fmt: skip
    return by_kind


def loadavg(rounds: list[tuple[str, Round]]) -> dict[str, float]:
    values = sorted(r.loadavg_1m for _, r in rounds)
    return {
        "min": round(values[0], 2),
        "p50": round(statistics.median(values), 2),
        "max": round(values[-1], 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--pods", type=int, default=50, help="pods of each kind, one at a time")
    ap.add_argument("--burst", type=int, default=30, help="pods of each kind created at once")
    ap.add_argument("--burst-rounds", type=int, default=3, help="rounds of bursts, the kinds' order rotating")
    ap.add_argument("--out", default=str(REPO / "bench/results/nodeside.json"))
    args = ap.parse_args()
    command = " ".join(["bench/nodeside.py", *sys.argv[1:]])
    loadavg_at_start = [round(x, 2) for x in os.getloadavg()]
    bins, helm_bin = ensure_binaries(), chart.helm_binary()
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="gpupack-nodeside-") as tmp,
        chart.real_node_installed(Path(tmp), bins, helm_bin, model="A100-40GB", gpus=2) as (cluster, node),
    ):
        up_s = time.monotonic() - t0
        kube = Kube.connect(str(cluster.kubeconfig))
        cpu = NodeSideCpu()
        print(f"node-side processes measured for CPU time: {cpu.pids}", file=sys.stderr, flush=True)
        try:
            agent = AgentMetrics(kube)
            one, bursts = measure(
                kube, cpu, agent, node.name, pods=args.pods, burst_size=args.burst,
                burst_rounds=args.burst_rounds,
            )  # fmt: skip
            slow = slow_answers(kube)
        finally:
            kube.close()
    single = phases([tm for _, r in one for tm in r.timers])
    single_cpu = cpu_ms(one)
    for kind in KINDS:
        single[kind] |= single_cpu[kind]
    burst = burst_summary(bursts) if bursts else {}
    doc = {
        "bench": "nodeside",
        "command": command,
        "machine": {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform()},
        "inputs": {"pods_each_kind": args.pods, "burst_each_kind": args.burst,
                   "burst_rounds": args.burst_rounds, "poll_ms": POLL_S * 1000,
                   "kinds": {k: v or "no GPU keys" for k, v in KINDS.items()}},
        "loadavg_at_start": loadavg_at_start,
        "loadavg_1m_one_at_a_time": loadavg(one),
        "loadavg_1m_bursts": loadavg(bursts) if bursts else None,
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "real_node_up_s": round(up_s, 1),
        "cpu_time_of": sorted(cpu.pids),
        "one_at_a_time": single,
        "one_at_a_time_added_over_plain": added(single),
        "burst": burst,
        "burst_added_over_plain": added(burst) if bursts else {},
        "agent_one_at_a_time": agent_one_at_a_time(one),
        "agent_bursts": agent_bursts(bursts),
        "agent_slow_answers": slow,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({"one_at_a_time_added_over_plain": doc["one_at_a_time_added_over_plain"],
                      "burst_added_over_plain": doc["burst_added_over_plain"],
                      "agent_one_at_a_time": doc["agent_one_at_a_time"]}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
