"""Summaries of simulation runs over seeds: the table, the JSON document and the allocation plot."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.tools.sim.engine import MAX_ARRIVED_PCT, RunResult


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """Means over seeds for one policy."""

    policy: str
    seeds: tuple[int, ...]
    alloc_pct_at_100: float
    alloc_pct_at_130: float
    frag_pct_at_100: float
    frag_pct_at_130: float
    failed_pods: float
    pods: float
    pods_per_second: float
    alloc_curve: tuple[float, ...]  # mean allocation % per arrived % 0..130

    @property
    def unallocated_pct_at_100(self) -> float:
        return 100.0 - self.alloc_pct_at_100

    @property
    def unallocated_pct_at_130(self) -> float:
        return 100.0 - self.alloc_pct_at_130


def summarise(results: Sequence[RunResult]) -> list[PolicySummary]:
    """One summary per policy, in the order policies first appear."""
    by_policy: dict[str, list[RunResult]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    out = []
    for policy, runs in by_policy.items():
        curve = tuple(_mean([r.alloc_pct[a] for r in runs]) for a in range(MAX_ARRIVED_PCT + 1))
        out.append(
            PolicySummary(
                policy=policy,
                seeds=tuple(r.seed for r in runs),
                alloc_pct_at_100=curve[100],
                alloc_pct_at_130=curve[MAX_ARRIVED_PCT],
                frag_pct_at_100=_mean([r.frag_pct[100] for r in runs]),
                frag_pct_at_130=_mean([r.frag_pct[MAX_ARRIVED_PCT] for r in runs]),
                failed_pods=statistics.fmean(r.failed for r in runs),
                pods=statistics.fmean(r.pods for r in runs),
                pods_per_second=statistics.fmean(r.pods_per_second for r in runs),
                alloc_curve=curve,
            )
        )
    return out


def _mean(values: Sequence[float]) -> float:
    real = [v for v in values if not math.isnan(v)]
    return statistics.fmean(real) if real else math.nan


COLUMNS = (  # (header, format); numbers are right-aligned to the header width
    ("policy", "<10"),
    ("alloc@100", ">9.2f"),
    ("unalloc@100", ">11.2f"),
    ("alloc@130", ">9.2f"),
    ("unalloc@130", ">11.2f"),
    ("frag@100", ">8.2f"),
    ("frag@130", ">8.2f"),
    ("failed", ">8.1f"),
    ("pods/s", ">8.0f"),
)


def format_table(summaries: Sequence[PolicySummary]) -> str:
    """Percentages of cluster GPU capacity at 100 % and 130 % arrived workload; means over seeds."""
    lines = [" ".join(format(name, fmt[:1] + fmt[1:].split(".")[0]) for name, fmt in COLUMNS)]
    for s in summaries:
        values = (
            s.policy,
            s.alloc_pct_at_100,
            s.unallocated_pct_at_100,
            s.alloc_pct_at_130,
            s.unallocated_pct_at_130,
            s.frag_pct_at_100,
            s.frag_pct_at_130,
            s.failed_pods,
            s.pods_per_second,
        )
        lines.append(" ".join(format(v, fmt) for (_, fmt), v in zip(COLUMNS, values, strict=True)))
    return "\n".join(lines)


def to_json(summaries: Sequence[PolicySummary], inputs: dict[str, Any]) -> dict[str, Any]:
    return {
        "inputs": inputs,
        "metric": "GPU allocation ratio = allocated GPU milli / cluster capacity, at arrived = 100 % / 130 %",
        "policies": {
            s.policy: {
                "seeds": list(s.seeds),
                "alloc_pct_at_100": round(s.alloc_pct_at_100, 3),
                "alloc_pct_at_130": round(s.alloc_pct_at_130, 3),
                "unallocated_pct_at_100": round(s.unallocated_pct_at_100, 3),
                "unallocated_pct_at_130": round(s.unallocated_pct_at_130, 3),
                "frag_pct_at_100": round(s.frag_pct_at_100, 3),
                "frag_pct_at_130": round(s.frag_pct_at_130, 3),
                "failed_pods": s.failed_pods,
                "pods": s.pods,
                "pods_per_second": round(s.pods_per_second, 1),
            }
            for s in summaries
        },
    }


def plot(summaries: Sequence[PolicySummary], path: Path, title: str) -> None:
    """GPU allocation vs arrived workload, one line per policy (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = list(range(MAX_ARRIVED_PCT + 1))
    for s in summaries:
        ax.plot(
            xs, s.alloc_curve, label=f"{s.policy} ({s.unallocated_pct_at_100:.2f} % unallocated at 100 %)"
        )
    ax.plot(xs, [min(x, 100) for x in xs], color="grey", linestyle=":", linewidth=1, label="ideal")
    ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
    ax.set_ylabel("GPU allocation ratio (%)")
    ax.set_xlim(0, MAX_ARRIVED_PCT)
    ax.set_ylim(0, 105)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
