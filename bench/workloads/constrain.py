"""Model-constrained variants of a trace: a share of its GPU pods pinned to GPU models of the fleet (pure).

The FGD paper's `gpuspec` traces pin 5-33 % of the openb GPU pods to one GPU model or a `|` set of them
(most often T4, then G2, P100, `V100M16|V100M32`). Those traces are not among the shared ones, so the
benchmark makes its own from any trace and node list: which pods are pinned and to what is drawn from a
seeded generator, never from a fixed model list, so the same code gives a mixed-fleet workload for any fleet.

The choices a pin can take are each GPU model of the fleet and each family of models that differ only by a
memory suffix (`V100M16|V100M32`: the same GPU with 16 or 32 GB). A choice is drawn with weight proportional
to how many nodes carry it (pods are pinned to the models a fleet has many of) times a seed's random factor,
so different seeds favour different models. A model holding under `MIN_GPU_SHARE` of the fleet's GPUs is
never a choice: pods pinned there mostly fail whatever the placement, which says nothing about packing.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from app.core.model import Node
from app.tools.sim.loader import TracePod

MIN_GPU_SHARE = 0.01
SEED_SPREAD = 2.0  # shape of the gamma factor per choice: smaller = seeds differ more
_MEMORY_SUFFIX = re.compile(r"M\d+$")  # V100M16 and V100M32 are one family


def model_choices(nodes: Sequence[Node]) -> dict[frozenset[str], int]:
    """The model sets a pod may be pinned to, each with the number of nodes that carry one of its models."""
    node_count: Counter[str] = Counter()
    gpu_count: Counter[str] = Counter()
    for node in nodes:
        for model in {g.model for g in node.gpus}:
            node_count[model] += 1
        for g in node.gpus:
            gpu_count[g.model] += 1
    total = sum(gpu_count.values())
    models = sorted(m for m, n in gpu_count.items() if n >= MIN_GPU_SHARE * total)
    choices = {frozenset([m]): node_count[m] for m in models}
    families: dict[str, list[str]] = {}
    for m in models:
        families.setdefault(_MEMORY_SUFFIX.sub("", m), []).append(m)
    for members in families.values():
        if len(members) > 1:
            choices[frozenset(members)] = sum(node_count[m] for m in members)
    return choices


def pin_models(
    pods: Sequence[TracePod], nodes: Sequence[Node], share: float, seed: int
) -> tuple[TracePod, ...]:
    """`pods` with round(share x GPU pods) of the GPU pods (drawn by `seed`) pinned to a model choice.

    Pods that already name models keep them and are not drawn. Deterministic for a given seed.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share={share!r}: must be in [0, 1]")
    choices = model_choices(nodes)
    if not choices:
        raise ValueError("nodes: no GPU model holds enough of the fleet's GPUs to pin pods to")
    rng = random.Random(seed)
    keys = sorted(choices, key=sorted)
    weights = [choices[k] * rng.gammavariate(SEED_SPREAD, 1.0) for k in keys]
    free = [i for i, p in enumerate(pods) if p.demand.count and not p.demand.models]
    picked = sorted(rng.sample(free, round(share * len(free))))
    pins = rng.choices(keys, weights, k=len(picked))
    out = list(pods)
    for i, models in zip(picked, pins, strict=True):
        out[i] = replace(pods[i], demand=replace(pods[i].demand, models=models))
    return tuple(out)
