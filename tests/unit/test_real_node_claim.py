"""One real node per machine: a test run and a dev cluster with `--real-node` never run theirs at once
(their node name, bridge, cgroups and CNI files are fixed, so the second would take down the first's pods)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.devcluster import kubeletnode
from tests.devcluster.processes import start_ticks


@pytest.fixture(autouse=True)
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubeletnode, "MACHINE_LOCK", tmp_path / "lock")
    monkeypatch.setattr(kubeletnode, "MACHINE_OWNER", tmp_path / "owner.json")


def own(cluster: str, pid: int, ticks: int | None) -> None:
    kubeletnode.MACHINE_OWNER.write_text(json.dumps({"cluster": cluster, "pid": pid, "ticks": ticks}))


def test_a_dev_cluster_whose_node_runs_keeps_the_machine_and_says_how_to_free_it(tmp_path: Path) -> None:
    own("/work/other/.gpupack-dev", os.getpid(), start_ticks(os.getpid()))  # a live process
    with pytest.raises(kubeletnode.RealNodeError) as refused:
        kubeletnode.claim_machine(tmp_path / "mine", wait=True)
    assert "/work/other/.gpupack-dev" in str(refused.value)
    assert "python -m tests.devcluster down --dir /work/other/.gpupack-dev" in str(refused.value)
    os.close(kubeletnode.claim_machine(Path("/work/other/.gpupack-dev"), wait=False))  # its own cluster may


def test_a_dev_cluster_whose_node_died_frees_the_machine(tmp_path: Path) -> None:
    own("/work/other/.gpupack-dev", os.getpid(), (start_ticks(os.getpid()) or 0) + 1)  # pid reused since
    os.close(kubeletnode.claim_machine(tmp_path / "mine", wait=False))


def test_while_a_test_run_holds_the_machine_a_dev_cluster_is_refused_at_once(tmp_path: Path) -> None:
    held = kubeletnode.claim_machine(tmp_path / "test-run", wait=True)
    try:
        with pytest.raises(kubeletnode.RealNodeError, match="real-node test run"):
            kubeletnode.claim_machine(tmp_path / "dev", wait=False)
    finally:
        os.close(held)
    os.close(kubeletnode.claim_machine(tmp_path / "dev", wait=False))  # free again once the run ends
