"""Model-constrained trace variants: which pods get pinned, to what, and that the same seed gives the same."""

from __future__ import annotations

from collections import Counter

import pytest

from app.core.model import Demand, Gpu, Node
from app.tools.sim.loader import TracePod
from bench.workloads.constrain import model_choices, pin_models


def fleet() -> list[Node]:
    """40 T4 nodes of 2, 10 G2 of 8, 5 V100M16 and 5 V100M32 of 4, one A10 (under 1 % of the GPUs)."""
    spec = [("T4", 40, 2), ("G2", 10, 8), ("V100M16", 5, 4), ("V100M32", 5, 4), ("A10", 1, 1)]
    return [
        Node(f"{model}-{i}", tuple(Gpu(g, model, 16_000) for g in range(gpus)))
        for model, nodes, gpus in spec
        for i in range(nodes)
    ]


def trace(n: int = 2000) -> tuple[TracePod, ...]:
    """Every fourth pod CPU-only, one pinned already, the rest GPU pods of various shapes."""
    pods = []
    for i in range(n):
        if i % 4 == 0:
            demand = Demand(0, cpu_milli=1000)
        elif i == 1:
            demand = Demand(1, milli=1000, models=frozenset({"G2"}))
        else:
            demand = Demand(1 + i % 2, milli=(250, 500, 1000)[i % 3] if i % 2 == 0 else 1000)
        pods.append(TracePod(f"p{i:05d}", demand))
    return tuple(pods)


def test_choices_are_the_fleets_models_and_memory_families_weighted_by_nodes() -> None:
    choices = model_choices(fleet())
    v100 = frozenset({"V100M16", "V100M32"})
    assert choices == {
        frozenset({"T4"}): 40,
        frozenset({"G2"}): 10,
        frozenset({"V100M16"}): 5,
        frozenset({"V100M32"}): 5,
        v100: 10,
    }  # A10 holds 1 of 141 GPUs: no choice


@pytest.mark.parametrize("share", [0.05, 0.2, 0.4])
def test_the_share_of_unpinned_gpu_pods_is_pinned_and_nothing_else_changes(share: float) -> None:
    pods = trace()
    out = pin_models(pods, fleet(), share, seed=7)
    free = [p for p in pods if p.demand.count and not p.demand.models]
    changed = [(a, b) for a, b in zip(pods, out, strict=True) if a != b]
    assert len(changed) == round(share * len(free))
    for before, after in changed:
        assert before.demand.count and not before.demand.models  # CPU pods and pinned ones stay
        assert after.name == before.name
        assert after.demand.models in model_choices(fleet())
        # Only the models change: the rest of the request is the pod's own.
        assert after.demand == Demand(**{**_fields(before.demand), "models": after.demand.models})
    assert out[1] == pods[1]


def _fields(d: Demand) -> dict[str, object]:
    return {f: getattr(d, f) for f in d.__dataclass_fields__}


def test_same_seed_same_trace_and_seeds_favour_different_models() -> None:
    pods, nodes = trace(), fleet()
    assert pin_models(pods, nodes, 0.3, seed=1) == pin_models(pods, nodes, 0.3, seed=1)
    leaders = set()
    for seed in range(1, 9):
        pinned = Counter(p.demand.models for p in pin_models(pods, nodes, 0.3, seed) if p.demand.models)
        leaders.add(pinned.most_common(1)[0][0])
    assert len(leaders) > 1


def test_bad_share_and_a_fleet_without_models_are_refused() -> None:
    with pytest.raises(ValueError, match=r"share=1.5: must be in \[0, 1\]"):
        pin_models(trace(), fleet(), 1.5, seed=1)
    with pytest.raises(ValueError, match="no GPU model"):
        pin_models(trace(), [Node("cpu", ())], 0.1, seed=1)
