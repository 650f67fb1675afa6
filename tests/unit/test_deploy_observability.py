"""The Grafana dashboard and the alert rules query only metrics that some gpupack component exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from agent import metrics as agent_metrics
from app.core.quota import QuotaUse
from extender import metrics
from webhook import metrics as webhook_metrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy/grafana/gpupack-dashboard.json"
RULES = REPO / "deploy/helm/gpupack/files/prometheus-rules.yaml"
SCRAPE = REPO / "deploy/prometheus/scrape-config.yaml"

# Grafana's own variables the dashboard may use; everything else must be a literal.
GRAFANA_VARS = {"$__rate_interval", "$__range", "${datasource}"}

_KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "inf", "nan", "atan2",
}  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.:$])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions, keywords, labels."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub("", text)
    out = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name in _KEYWORDS:
            continue
        out.add(name)
    return out


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("gpupack_extender_leader", {"gpupack_extender_leader"}),
        (
            'sum by (le, verb) (rate(x_bucket{verb="bind", le=~"0.1|inf"}[5m])) and on(instance) (y == 1)',
            {"x_bucket", "y"},
        ),
        ("count(a > 0) or vector(0)", {"a"}),
        ("topk(20, a - on(node, gpu) group_left(model) b) / 1000", {"a", "b"}),
        ("histogram_quantile(0.99, rate(h_bucket[$__rate_interval])) offset 5m", {"h_bucket"}),
        ("ceil(sum(a) / 1e3)", {"a"}),
    ],
    ids=["bare", "matchers-and-join", "vector-literal", "group-left", "grafana-var-offset", "number"],
)
def test_metric_names_parser(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def _family_samples(family_name: str, kind: str) -> set[str]:
    if kind == "counter":
        return {f"{family_name}_total", f"{family_name}_created"}
    if kind == "histogram":
        return {f"{family_name}_{s}" for s in ("bucket", "count", "sum", "created")}
    return {family_name}


def exported_names() -> set[str]:
    """Every sample name the components define: their module-level metrics and the extender's collector."""
    out: set[str] = set()
    for module in (webhook_metrics, metrics, agent_metrics):
        for value in vars(module).values():
            if isinstance(value, MetricWrapperBase):
                for family in value.describe():
                    out |= _family_samples(family.name, family.type)
    sample = metrics.ExtenderGauges(
        gpus=(metrics.GpuGauge(node="n", gpu=0, model="m", milli=500, memory_mib=100, pods=1),),
        pending={"no_fit": 1},
        leader=True,
        quotas=(QuotaUse("ns", "gpu", "requests.gpupack.io/quota-gpu-milli", Fraction(500), Fraction(1000)),),
    )
    for family in metrics.ExtenderStateCollector(lambda: sample).collect():
        out |= _family_samples(family.name, family.type)
    return out


def test_exported_names_sees_every_kind() -> None:
    names = exported_names()
    # one of each: counter, histogram, plain gauge, labelled gauge, collector gauge
    assert {
        "gpupack_webhook_reviews_total",
        "gpupack_extender_request_duration_seconds_bucket",
        "gpupack_agent_mps_up",
        "gpupack_agent_gpu_memory_used_mib",
        "gpupack_extender_packing_efficiency_ratio",
    } <= names


def dashboard() -> dict[str, Any]:
    doc = json.loads(DASHBOARD.read_text())
    assert isinstance(doc, dict)
    return doc


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in doc["panels"]:
        yield p
        yield from p.get("panels", [])


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) for every query of the dashboard."""
    return [(p["title"], t["expr"]) for p in panels(dashboard()) for t in p.get("targets", [])]


def rule_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [(r["alert"], r["expr"]) for g in doc["groups"] for r in g["rules"]]


def test_dashboard_is_importable_grafana_json() -> None:
    doc = dashboard()
    assert doc["uid"] and doc["title"]
    assert [v["name"] for v in doc["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    occupied: set[tuple[int, int]] = set()
    for p in panels(doc):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        cells = {(g["y"] + dy, g["x"] + dx) for dy in range(g["h"]) for dx in range(g["w"])}
        assert not cells & occupied, f"panel {p['title']!r} overlaps another"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), p["title"]


def test_dashboard_covers_the_issue_panels() -> None:
    exprs = " ".join(e for _, e in dashboard_exprs())
    for needed in (
        "gpupack_extender_packing_efficiency_ratio",  # packing efficiency
        "ceil(sum(",  # lower bound of GPUs
        "gpupack_extender_fragmented_milli",
        "gpupack_agent_gpu_memory_used_mib",  # allocated vs used
        "gpupack_extender_gpu_pods",
        "gpupack_extender_pending_pods",
        "histogram_quantile(0.99, sum by (le, verb) (rate(gpupack_extender_request_duration_seconds_bucket",
        "gpupack_webhook_reviews_total",
        "gpupack_extender_namespace_quota_used",  # use against quota per namespace
        "gpupack_extender_namespace_quota_hard",
        "gpupack_agent_gpu_memory_borrowed_mib",  # memory borrowed above requests per GPU (burstable)
    ):
        assert needed in exprs, needed
    assert any(p["type"] == "heatmap" for p in panels(dashboard()))


@pytest.mark.parametrize(("where", "expr"), dashboard_exprs() + rule_exprs())
def test_queries_use_only_exported_metrics(where: str, expr: str) -> None:
    used = metric_names(expr)
    assert used, f"{where}: no metric in {expr!r}"
    unknown = used - exported_names()
    assert not unknown, f"{where}: {sorted(unknown)} not defined in any component's metrics module"


@pytest.mark.parametrize(("where", "expr"), dashboard_exprs())
def test_dashboard_uses_only_known_grafana_variables(where: str, expr: str) -> None:
    found = set(re.findall(r"\$\{?\w+\}?", expr))
    assert found <= GRAFANA_VARS, f"{where}: {sorted(found - GRAFANA_VARS)}"


def test_cluster_state_panels_keep_the_leader_only() -> None:
    """Standby extenders export the same per-GPU gauges; summing them all would double-count."""
    state = re.compile(
        r"gpupack_extender_(gpu_\w+|packing_\w+|fragmented_\w+|typical_\w+|gpus_free|pending_pods|namespace_quota_\w+)"
    )
    for title, expr in dashboard_exprs():
        if state.search(expr):
            assert "and on(instance) (gpupack_extender_leader == 1)" in expr, title


def test_rules_copy_for_plain_prometheus_is_identical() -> None:
    assert (REPO / "deploy/prometheus/gpupack-rules.yaml").read_text() == RULES.read_text()


def test_scrape_config_gives_agents_a_node_label() -> None:
    jobs = {j["job_name"]: j for j in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]}
    for static in jobs["gpupack-agent"]["static_configs"]:
        assert "node" in static["labels"]
    relabels = jobs["gpupack-agent-k8s"]["relabel_configs"]
    assert {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"} in relabels
    assert not any(j.get("honor_labels") for j in jobs.values())
