"""One real control plane for a test tier, and its component logs on every failed test of that tier.

Shared by tests/integration (one per session) and tests/compat (one per package).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.devcluster import BinariesError, Cluster, ensure_binaries

LOG_LINES = 25


def running_cluster(
    tmp_path_factory: pytest.TempPathFactory, dirname: str, tier: str, active: list[Cluster]
) -> Iterator[Cluster]:
    """Start a cluster (FAIL, never skip, without binaries), list it in `active` while it runs, stop it."""
    try:
        bins = ensure_binaries()
    except BinariesError as exc:
        pytest.fail(f"{tier} needs Kubernetes binaries and they cannot be built:\n{exc}", pytrace=False)
    c = Cluster.prepare(tmp_path_factory.mktemp(dirname), bins)
    c.start()
    active.append(c)
    try:
        yield c
    finally:
        active.remove(c)
        c.stop()  # raises if any process survives SIGKILL


def attach_log_tails(
    report: pytest.TestReport, item: pytest.Item, tier_dir: Path, active: list[Cluster]
) -> None:
    """A failed test of the tier gets the tail of every component log in its report."""
    if report.failed and active and tier_dir in item.path.parents:
        tails = active[0].log_tails(lines=LOG_LINES)
        report.sections.append(
            ("control-plane logs (tail)", "\n".join(f"---- {name}\n{text}" for name, text in tails.items()))
        )
