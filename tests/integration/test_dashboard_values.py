"""The dashboard's queries give the right numbers: known series into a real Prometheus, expected values out.

The series are backfilled with `promtool tsdb create-blocks-from openmetrics` at fixed timestamps (one sample
every 15 s for 10 minutes), so rates and quantiles are exact; every query runs at the last sample's time. A
standby extender exports the same cluster gauges with other values, so a panel that drops the leader filter,
or applies it to the wrong operand, shows the wrong number. Each dashboard target is named by its panel title
and legend; the expected values are keyed by the legend as Grafana renders it from the result's labels.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.devcluster import wait_for
from tests.devcluster.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy/grafana/gpupack-dashboard.json"
GRAFANA_VARS = {"$__rate_interval": "1m", "$__range": "5m"}
STEP_S = 15
STEPS = 40  # 10 minutes of samples
LEADER = {"job": "gpupack-extender", "instance": "extender-a:8889"}
STANDBY = {"job": "gpupack-extender", "instance": "extender-b:8889"}
HOOK_A = {"job": "gpupack-webhook", "instance": "webhook-a:8443"}
HOOK_B = {"job": "gpupack-webhook", "instance": "webhook-b:8443"}
AGENT_1 = {"job": "gpupack-agent", "instance": "node-1:9400", "node": "node-1"}
AGENT_2 = {"job": "gpupack-agent", "instance": "node-2:9400", "node": "node-2"}
MILLI_QUOTA = "requests.gpupack.io/quota-gpu-milli"
MIB_QUOTA = "requests.gpupack.io/quota-gpu-memory-mib"


@dataclass(frozen=True)
class Series:
    """One series: a gauge (`per_s` 0) or a counter starting at `start` and growing `per_s` each second."""

    name: str
    labels: dict[str, str]
    start: float
    per_s: float = 0.0

    def line(self, t: int, step: int) -> str:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(self.labels.items()))
        return f"{self.name}{{{labels}}} {self.start + self.per_s * step * STEP_S} {t}"


def gpu(node: str, index: int) -> dict[str, str]:
    return {"node": node, "gpu": str(index), "model": "A100-40GB"}


def extender_series() -> list[Series]:
    # (node, gpu): allocated milli, allocated MiB, pods -- the leader's view
    leader_gpus = {
        ("node-1", 0): (1000, 40960, 2),
        ("node-1", 1): (500, 20480, 1),
        ("node-1", 2): (0, 0, 0),
        ("node-2", 0): (250, 10240, 1),
    }
    out: list[Series] = []
    for (node, index), (milli, mib, pods) in leader_gpus.items():
        labels = gpu(node, index)
        out += [
            Series("gpupack_extender_gpu_allocated_milli", {**LEADER, **labels}, milli),
            Series("gpupack_extender_gpu_allocated_memory_mib", {**LEADER, **labels}, mib),
            Series("gpupack_extender_gpu_pods", {**LEADER, **labels}, pods),
            # the standby's stale view: every GPU full
            Series("gpupack_extender_gpu_allocated_milli", {**STANDBY, **labels}, 1000),
            Series("gpupack_extender_gpu_allocated_memory_mib", {**STANDBY, **labels}, 40960),
            Series("gpupack_extender_gpu_pods", {**STANDBY, **labels}, 4),
        ]
    for who, leader, efficiency, fragmented, typical, free in (
        (LEADER, 1, 0.875, 900, 250, 1),
        (STANDBY, 0, 0.5, 100, 1000, 0),
    ):
        out += [
            Series("gpupack_extender_leader", who, leader),
            Series("gpupack_extender_packing_efficiency_ratio", who, efficiency),
            Series("gpupack_extender_fragmented_milli", who, fragmented),
            Series("gpupack_extender_typical_request_milli", who, typical),
            Series("gpupack_extender_gpus_free", who, free),
        ]
    out += [
        Series("gpupack_extender_pending_pods", {**LEADER, "reason": "no_fit"}, 2),
        Series("gpupack_extender_pending_pods", {**LEADER, "reason": "model"}, 1),
        Series("gpupack_extender_pending_pods", {**STANDBY, "reason": "no_fit"}, 5),
    ]
    quotas = [
        (LEADER, "team-a", MILLI_QUOTA, 1500, 2000),
        (LEADER, "team-a", MIB_QUOTA, 10240, 40960),
        (LEADER, "team-b", MILLI_QUOTA, 0, 0),
        (STANDBY, "team-a", MILLI_QUOTA, 500, 4000),
        (STANDBY, "team-a", MIB_QUOTA, 0, 40960),
    ]
    for who, ns, resource, used, hard in quotas:
        labels = {**who, "namespace": ns, "quota": "gpu", "resource": resource}
        out += [
            Series("gpupack_extender_namespace_quota_used", labels, used),
            Series("gpupack_extender_namespace_quota_hard", labels, hard),
        ]
    migs = [(LEADER, "0", "3g.40gb", 1), (LEADER, "1", "3g.40gb", 0), (LEADER, "2", "1g.10gb", 0)]
    migs += [(STANDBY, "0", "3g.40gb", 0), (STANDBY, "2", "1g.10gb", 1)]
    for who, mig, profile, held in migs:
        labels = {**who, "node": "node-3", "gpu": "0", "mig": mig, "profile": profile}
        out.append(Series("gpupack_extender_mig_device_allocated", labels, held))
    out += [
        Series("gpupack_extender_binds_total", {**LEADER, "outcome": "bound"}, 100, 0.5),
        Series("gpupack_extender_binds_total", {**LEADER, "outcome": "conflict"}, 100, 0.1),
        Series("gpupack_extender_binds_total", {**STANDBY, "outcome": "bound"}, 100),
    ]
    # per second, filter: 2 calls <= 5 ms and 2 in (5, 10] ms; bind: 1 in (50, 100] ms and 3 in (100, 250] ms
    buckets = {"filter": (2, 4, 4, 4, 4, 4), "bind": (0, 0, 0, 1, 4, 4)}
    for verb, cumulative in buckets.items():
        for le, per_s in zip(("0.005", "0.01", "0.05", "0.1", "0.25", "+Inf"), cumulative, strict=True):
            labels = {**LEADER, "verb": verb, "le": le}
            out.append(Series("gpupack_extender_request_duration_seconds_bucket", labels, 1000, per_s))
    return out


def webhook_series() -> list[Series]:
    out = [
        Series("gpupack_webhook_reviews_total", {**HOOK_A, "outcome": "mutated"}, 100, 1.0),
        Series("gpupack_webhook_reviews_total", {**HOOK_B, "outcome": "mutated"}, 100, 1.0),
        Series("gpupack_webhook_reviews_total", {**HOOK_B, "outcome": "denied"}, 100, 0.2),
    ]
    # per second, worker a: 1 review <= 1 ms; worker b: 1 in (1, 2.5] ms
    for who, cumulative in ((HOOK_A, (1, 1, 1)), (HOOK_B, (0, 1, 1))):
        for le, per_s in zip(("0.001", "0.0025", "+Inf"), cumulative, strict=True):
            labels = {**who, "le": le}
            out.append(Series("gpupack_webhook_review_duration_seconds_bucket", labels, 1000, per_s))
    return out


def agent_series() -> list[Series]:
    # (agent, gpu): used MiB, utilization, healthy, borrowed MiB
    gpus = {
        (0, 0): (30000, 0.9, 1, 2048),
        (0, 1): (20480, 0.5, 1, 0),
        (0, 2): (512, 0.0, 1, 0),  # a process outside gpupack
        (1, 0): (4096, 0.25, 0, 0),
    }
    agents = (AGENT_1, AGENT_2)
    out: list[Series] = []
    for (a, index), (used, util, healthy, borrowed) in gpus.items():
        labels = {**agents[a], "gpu": str(index), "uuid": f"GPU-{a}{index}"}
        out += [
            Series("gpupack_agent_gpu_memory_used_mib", labels, used),
            Series("gpupack_agent_gpu_memory_total_mib", labels, 40960),
            Series("gpupack_agent_gpu_utilization_ratio", labels, util),
            Series("gpupack_agent_gpu_healthy", labels, healthy),
            Series("gpupack_agent_gpu_memory_borrowed_mib", labels, borrowed),
        ]
    pods = [(AGENT_1, "train", 20480, 15000), (AGENT_2, "infer", 10240, 4096)]
    for who, pod, limit, used in pods:
        labels = {**who, "namespace": "team-a", "pod": pod, "gpu": "0"}
        out += [
            Series("gpupack_agent_pod_memory_limit_mib", labels, limit),
            Series("gpupack_agent_pod_memory_used_mib", labels, used),
        ]
    for who, age, mps in ((AGENT_1, 3, 1), (AGENT_2, 4, 0)):
        out += [
            Series("gpupack_agent_heartbeat_age_seconds", who, age),
            Series("gpupack_agent_mps_up", who, mps),
            Series("gpupack_agent_nvml_errors_total", {**who, "code": "gpu_is_lost"}, 10, 0.05),
            Series("gpupack_agent_kube_writes_total", {**who, "kind": "gpunode", "result": "ok"}, 10, 0.5),
        ]
    # one violation a minute on node-1, none on node-2
    out += [
        Series("gpupack_agent_violations_total", {**AGENT_1, "kind": "foreign_process"}, 10, 1 / 60),
        Series("gpupack_agent_violations_total", {**AGENT_2, "kind": "foreign_process"}, 10),
    ]
    return out


# (panel title, legend) -> {legend as rendered: value}; every dashboard target has a row
EXPECTED: dict[tuple[str, str], dict[str, float]] = {
    ("Packing efficiency", "efficiency"): {"efficiency": 0.875},
    ("GPUs in use vs lower bound", "GPUs in use"): {"GPUs in use": 3},
    ("GPUs in use vs lower bound", "lower bound (ceil of allocated share)"): {
        "lower bound (ceil of allocated share)": 2  # 1750 milli
    },
    ("GPUs in use vs lower bound", "GPUs free"): {"GPUs free": 1},
    ("Fragmentation", "fragmented (GPUs)"): {"fragmented (GPUs)": 0.9},
    ("Fragmentation", "typical request (GPU share)"): {"typical request (GPU share)": 0.25},
    ("Pods per GPU", "average (GPUs in use)"): {"average (GPUs in use)": 4 / 3},
    ("Pods per GPU", "max"): {"max": 2},
    ("Allocation per GPU (share)", "{{node}}/{{gpu}}"): {
        "node-1/0": 1.0,
        "node-1/1": 0.5,
        "node-1/2": 0.0,
        "node-2/0": 0.25,
    },
    ("Allocated vs used GPU memory per GPU", "allocated {{node}}/{{gpu}}"): {
        "allocated node-1/0": 40960,
        "allocated node-1/1": 20480,
        "allocated node-1/2": 0,
        "allocated node-2/0": 10240,
    },
    ("Allocated vs used GPU memory per GPU", "used {{node}}/{{gpu}}"): {
        "used node-1/0": 30000,
        "used node-1/1": 20480,
        "used node-1/2": 512,
        "used node-2/0": 4096,
    },
    ("Right-sizing gap per GPU", "{{node}}/{{gpu}}"): {
        "node-1/0": 10960,
        "node-1/1": 0,
        "node-1/2": -512,
        "node-2/0": 6144,
    },
    ("Pod memory: limit vs used", "{{namespace}}/{{pod}} gpu {{gpu}}"): {
        "team-a/train gpu 0": 5480,
        "team-a/infer gpu 0": 6144,
    },
    ("GPU utilization", "{{node}}/{{gpu}}"): {
        "node-1/0": 0.9,
        "node-1/1": 0.5,
        "node-1/2": 0.0,
        "node-2/0": 0.25,
    },
    ("Pending gpupack pods by reason", "{{reason}}"): {"no_fit": 2, "model": 1},
    ("Extender latency", "p50 {{verb}}"): {"p50 filter": 0.005, "p50 bind": 0.15},
    ("Extender latency", "p99 {{verb}}"): {
        "p99 filter": 0.005 + 0.005 * (3.96 - 2) / 2,
        "p99 bind": 0.1 + 0.15 * (3.96 - 1) / 3,
    },
    ("Binds by outcome", "{{outcome}}"): {"bound": 0.5, "conflict": 0.1},
    ("Webhook reviews by outcome", "{{outcome}}"): {"mutated": 2.0, "denied": 0.2},
    ("Webhook latency", "p50"): {"p50": 0.001},
    ("Webhook latency", "p99"): {"p99": 0.001 + 0.0015 * 0.98},
    ("Extender leader", "{{instance}}"): {"extender-a:8889": 1, "extender-b:8889": 0},
    ("Agent heartbeat age", "{{node}}"): {"node-1": 3, "node-2": 4},
    ("MPS daemon up", "{{node}}"): {"node-1": 1, "node-2": 0},
    ("Unhealthy GPUs", "unhealthy"): {"unhealthy": 1},
    ("NVML errors", "{{code}}"): {"gpu_is_lost": 0.1},
    ("Allocation violations", "{{kind}}"): {"foreign_process": 5},  # 1 a minute over the 5 m range
    ("Agent API writes", "{{kind}} {{result}}"): {"gpunode ok": 1.0},
    ("GPU quota use per namespace", "{{namespace}} {{resource}}"): {
        f"team-a {MILLI_QUOTA}": 0.75,
        f"team-a {MIB_QUOTA}": 0.25,
    },
    ("GPU share quota per namespace (GPUs)", "{{namespace}} used"): {"team-a used": 1.5, "team-b used": 0},
    ("GPU share quota per namespace (GPUs)", "{{namespace}} limit"): {"team-a limit": 2, "team-b limit": 0},
    ("MIG devices by profile: allocated and free", "{{profile}} allocated"): {"3g.40gb allocated": 1},
    ("MIG devices by profile: allocated and free", "{{profile}} free"): {
        "3g.40gb free": 1,
        "1g.10gb free": 1,
    },
    ("GPU memory borrowed above requests per GPU", "{{node}} gpu {{gpu}}"): {
        "node-1 gpu 0": 2048,
        "node-1 gpu 1": 0,
        "node-1 gpu 2": 0,
        "node-2 gpu 0": 0,
    },
    ("Borrowed share of GPU memory per GPU", "{{node}} gpu {{gpu}}"): {
        "node-1 gpu 0": 0.05,
        "node-1 gpu 1": 0,
        "node-1 gpu 2": 0,
        "node-2 gpu 0": 0,
    },
}


def dashboard_targets() -> list[tuple[str, str, str]]:
    """(panel title, legend, query with Grafana's variables filled) for every target, rows included."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    out = []
    for p in panels(json.loads(DASHBOARD.read_text())["panels"]):
        for t in p.get("targets", []):
            expr = t["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            out.append((p["title"], t.get("legendFormat", ""), expr))
    return out


def legend(fmt: str, labels: dict[str, str]) -> str:
    """The series name Grafana shows: `{{label}}` replaced by the label's value (empty when absent)."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


@dataclass(frozen=True)
class FedPrometheus:
    query: Callable[[str], list[dict[str, Any]]]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FedPrometheus]:
    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    assert binary and promtool, "prometheus/promtool missing: .ci/system-deps installs the Debian package"
    work = tmp_path_factory.mktemp("dashboard-values")
    # an hour ago, so the blocks lie wholly in the past and inside the default retention
    t0 = int(time.time()) - 3600
    t_end = t0 + STEPS * STEP_S
    lines = [
        s.line(t0 + step * STEP_S, step)
        for s in extender_series() + webhook_series() + agent_series()
        for step in range(STEPS + 1)
    ]
    feed = work / "series.om"
    feed.write_text("\n".join(lines) + "\n# EOF\n")
    tsdb = work / "tsdb"
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(feed), str(tsdb)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    config = work / "prometheus.yml"
    config.write_text("global: {}\n")
    port = free_ports(1)[0]
    base = f"http://127.0.0.1:{port}"
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={tsdb}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def ready() -> bool:
        try:
            with opener.open(f"{base}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def query(expr: str) -> list[dict[str, Any]]:
        url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": str(t_end)})
        with opener.open(url, timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    with (work / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(ready, 60, "prometheus ready")
            yield FedPrometheus(query)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_every_dashboard_target_has_expected_values() -> None:
    targets = {(title, fmt) for title, fmt, _ in dashboard_targets()}
    assert targets == set(EXPECTED), (
        f"targets without expectations: {sorted(targets - set(EXPECTED))}; "
        f"expectations without a target: {sorted(set(EXPECTED) - targets)}"
    )


@pytest.mark.parametrize(
    ("title", "fmt", "expr"), dashboard_targets(), ids=[f"{t}|{f}" for t, f, _ in dashboard_targets()]
)
def test_dashboard_query_gives_expected_values(
    prometheus: FedPrometheus, title: str, fmt: str, expr: str
) -> None:
    got: dict[str, float] = {}
    for result in prometheus.query(expr):
        name = legend(fmt, result["metric"])
        assert name not in got, f"{title}: two series render as {name!r}: {expr}"
        got[name] = float(result["value"][1])
    want = EXPECTED[(title, fmt)]
    assert set(got) == set(want), f"{title}: series {sorted(got)}, want {sorted(want)}: {expr}"
    wrong = {
        k: (got[k], v) for k, v in want.items() if not math.isclose(got[k], v, rel_tol=1e-9, abs_tol=1e-9)
    }
    assert not wrong, f"{title}: (got, want) {wrong}: {expr}"
