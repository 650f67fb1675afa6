"""Every simulator outcome but its timings, printed in full precision: a checksum of the replay's decisions.

Runs `simulate` (openb default seeds 42-43, gpushare40 and gpushare100 seed 42, default with 30 % of GPU pods
pinned to models by `bench.workloads.constrain` seed 2; each policy), `replay` (300 nodes, 3000 gpushare40
pods: every placement and the nodes after), `churn` (300 nodes, 3 rounds, with and without repack; each
policy) and `saturate` (each mode, fragaware), and prints repr() of every result field except `seconds`.
Two trees decide alike exactly when their outputs have the same sha256 (bench/results/engine.json).

Usage: .venv/bin/python bench/simdump.py [--traces-dir /work/shared/traces] | sha256sum
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core.placement import TargetWorkload, registry  # noqa: E402
from app.tools.sim.engine import replay, simulate  # noqa: E402
from app.tools.sim.loader import TracePod, load_nodes, load_pods  # noqa: E402
from bench.workloads.churn import churn  # noqa: E402
from bench.workloads.constrain import pin_models  # noqa: E402
from bench.workloads.saturate import Mode, saturate  # noqa: E402


def show(tag: str, result: Any) -> None:
    fields = asdict(result)
    fields.pop("seconds", None)
    print(tag, repr(fields), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces-dir", default="/work/shared/traces")
    root = Path(ap.parse_args().traces_dir)
    nodes = load_nodes(root / "openb_node_list_gpu_node.csv")

    def trace(name: str, pin: tuple[float, int] | None = None) -> tuple[tuple[TracePod, ...], TargetWorkload]:
        pods = load_pods(root / f"openb_pod_list_{name}.csv")
        if pin:
            pods = pin_models(pods, nodes, pin[0], pin[1])
        return pods, TargetWorkload.from_demands(p.demand for p in pods).on_fleet(nodes)

    runs: tuple[tuple[str, tuple[int, ...], tuple[float, int] | None], ...] = (
        ("default", (42, 43), None),
        ("gpushare40", (42,), None),
        ("gpushare100", (42,), None),
        ("default", (42,), (0.3, 2)),
    )
    for name, seeds, pin in runs:
        pods, wl = trace(name, pin)
        for policy in registry.names():
            for seed in seeds:
                show(
                    f"sim {name} {pin} {policy} {seed}",
                    simulate(nodes, pods, registry.create(policy, wl), wl, seed=seed),
                )
    pods, wl = trace("gpushare40")
    for policy in registry.names():
        where, after = replay(nodes[:300], [p.demand for p in pods[:3000]], registry.create(policy, wl), wl)
        print("replay", policy, repr(where), flush=True)
        print("replay-nodes", policy, repr(after), flush=True)
        for repack in (False, True):
            result = churn(
                nodes[:300], pods, registry.create(policy, wl), wl, seed=42, rounds=3, repack=repack
            )
            show(f"churn {policy} {repack}", result)
    for mode in Mode:
        show(
            f"saturate {mode}",
            saturate(nodes[:300], pods, registry.create("fragaware", wl), wl, seed=42, mode=mode),
        )


if __name__ == "__main__":
    main()
