"""The target workload (FGD's "typical pods") and a node's expected fragmentation against it."""

from __future__ import annotations

import json
import math
import random
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import resources
from itertools import accumulate
from typing import Any

from app.core.model import MILLI_PER_GPU, Demand, Node

DEFAULT_FILE = "typical_pods.json"
# Frag memo entries kept per workload; a live cluster sees few distinct node states, so this rarely clears.
_MEMO_LIMIT = 500_000
SETTLE_POOL_GPUS = 8000  # large enough that V barely moves between pool seeds; ~0.1 s to build
_NOTHING_SETTLES = tuple(float(x) for x in range(MILLI_PER_GPU + 1))  # no pod comes: every hole stays
# A learned workload needs this many GPU pods: below it a shape's share is mostly chance (one pod moves it
# 2 % or more), so the built-in distribution is used whole rather than blended with a noisy one.
MIN_LEARNED_PODS = 50
# Learned weights are rounded to this step, so a workload is a function of the pods' shapes that a few
# pods more or less rarely change: every change invalidates the extender's rankings.
WEIGHT_STEP = 0.02


@dataclass(frozen=True, slots=True)
class PodShape:
    """One kind of pod the cluster expects, with its share of all pods."""

    cpu_milli: int
    milli: int  # per GPU; 0 for CPU-only pods
    count: int  # GPUs; 0 for CPU-only pods
    models: frozenset[str]
    weight: float


ShapeKey = tuple[int, int, int, frozenset[str]]


@dataclass(frozen=True, slots=True)
class _FragTerms:
    """`node_frag`'s shapes for one model and CPU step, grouped so a node's holes are measured once per
    distinct shape rather than once per shape."""

    hostable: tuple[tuple[int, int], ...]  # the distinct (milli, count) of the shapes such a node may host
    # Per shape, in the workload's order: its weight, and its index in `hostable` or len(hostable) (a shape
    # such a node cannot host: every free milli is a fragment).
    shapes: tuple[tuple[float, int], ...]


@dataclass(frozen=True, eq=False)
class TargetWorkload:
    """A probability distribution over pod shapes (weights sum to 1)."""

    shapes: tuple[PodShape, ...]
    # GPUs per model of the cluster the workload runs on, sorted by model; () when not known (then no
    # shape counts as scarce: see `scarcity`).
    fleet: tuple[tuple[str, int], ...] = ()
    _scarcity: dict[tuple[str, frozenset[str]], float] = field(default_factory=dict, repr=False)
    _memo: dict[tuple[int, tuple[int, ...], str], float] = field(default_factory=dict, repr=False)
    _settled: dict[int, tuple[float, ...]] = field(default_factory=dict, repr=False)
    _plans: dict[str, tuple[tuple[float, int, int, int], ...]] = field(default_factory=dict, repr=False)
    _frag_terms: dict[tuple[str, int], _FragTerms] = field(default_factory=dict, repr=False)
    _usable: dict[tuple[int, ...], float] = field(default_factory=dict, repr=False)
    _landing: dict[str, TargetWorkload | None] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        errors = [f"shapes[{i}]: {e}" for i, s in enumerate(self.shapes) for e in _shape_errors(s)]
        if not self.shapes:
            errors.append("shapes: must not be empty")
        elif abs(sum(s.weight for s in self.shapes) - 1.0) > 1e-6:
            errors.append("shapes: weights must sum to 1")
        errors += [f"fleet[{m!r}]={n!r}: must be a positive number of GPUs" for m, n in self.fleet if n <= 0]
        if errors:
            raise ValueError("; ".join(errors))

    @classmethod
    def from_counts(cls, counts: Mapping[ShapeKey, int], coverage: float = 0.95) -> TargetWorkload:
        """The most common shapes covering `coverage` of all pods, renormalised (FGD's construction)."""
        total = sum(counts.values())
        if total <= 0:
            raise ValueError("target workload: no pods to learn shapes from")
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], _sortable(kv[0])), reverse=True)
        kept: list[tuple[ShapeKey, int]] = []
        covered = 0
        for key, n in ranked:
            if covered >= coverage * total:
                break
            kept.append((key, n))
            covered += n
        return cls(tuple(PodShape(k[0], k[1], k[2], k[3], n / covered) for k, n in kept))

    @classmethod
    def from_demands(cls, demands: Iterable[Demand], coverage: float = 0.95) -> TargetWorkload:
        """Learn the distribution from fraction/whole/CPU-only demands (memory requests are skipped)."""
        counts: Counter[ShapeKey] = Counter()
        for d in demands:
            if d.count == 0:
                counts[(d.cpu_milli, 0, 0, d.models)] += 1
            elif d.milli is not None:
                counts[(d.cpu_milli, d.milli, d.count, d.models)] += 1
        return cls.from_counts(counts, coverage)

    @classmethod
    def from_json(cls, raw: Any, source: str = "target workload") -> TargetWorkload:
        """Parse {"shapes": [{"cpu_milli", "gpu_milli", "num_gpu", "gpu_spec", "weight"}, ...]}."""
        items = raw.get("shapes") if isinstance(raw, dict) else None
        if not isinstance(items, list):
            raise ValueError(f"{source}: shapes: must be a list")
        counts: list[tuple[ShapeKey, float]] = []
        for i, item in enumerate(items):
            where = f"{source}: shapes[{i}]"
            if not isinstance(item, dict):
                raise ValueError(f"{where}: must be an object")
            ints = {}
            for key in ("cpu_milli", "gpu_milli", "num_gpu"):
                v = item.get(key)
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"{where}.{key}={v!r}: must be a non-negative integer")
                ints[key] = v
            w = item.get("weight")
            if not isinstance(w, int | float) or isinstance(w, bool) or not w > 0:
                raise ValueError(f"{where}.weight={w!r}: must be a positive number")
            spec = item.get("gpu_spec", "")
            if not isinstance(spec, str):
                raise ValueError(f"{where}.gpu_spec={spec!r}: must be a '|'-separated string")
            models = frozenset(m for m in spec.split("|") if m)
            counts.append(((ints["cpu_milli"], ints["gpu_milli"], ints["num_gpu"], models), float(w)))
        total = sum(w for _, w in counts)
        try:
            return cls(tuple(PodShape(k[0], k[1], k[2], k[3], w / total) for k, w in counts))
        except (ValueError, ZeroDivisionError) as e:
            raise ValueError(f"{source}: {e}") from None

    def on_fleet(self, nodes: Iterable[Node]) -> TargetWorkload:
        """This workload on the cluster of `nodes`: the same shapes, with the GPUs per model it has."""
        gpus = Counter(g.model for node in nodes for g in node.gpus if not g.mig_profile)
        return TargetWorkload(self.shapes, tuple(sorted(gpus.items())))

    def scarcity(self, model: str, allowed: frozenset[str]) -> float:
        """The share of `model`'s GPUs that pods with fewer places to go than `allowed` will fill.

        A pod that may run on the models `allowed` (empty: any) takes GPU room on `model` that a pod
        pinned to a narrower set holding `model` may need: on a fleet with few T4s and many pods that
        run only on a T4, every milli an unpinned pod takes on a T4 is a milli some T4 pod will miss.
        Pods arrive until the fleet's capacity has arrived; a narrower shape's GPU demand spreads over its
        models by their GPUs. The answer is that demand on `model` over its GPUs, at most 1; 0.0 without
        a fleet or where no narrower shape holds `model`.
        """
        key = (model, allowed)
        hit = self._scarcity.get(key)
        if hit is not None:
            return hit
        gpus = dict(self.fleet)
        wider = frozenset(gpus) if not allowed else allowed & gpus.keys()
        mean = sum(s.weight * s.milli * s.count for s in self.shapes)  # GPU milli per arriving pod
        pressure = 0.0
        if model in wider and mean:
            for s in self.shapes:
                narrow = s.models & gpus.keys()
                if s.count and s.models and model in narrow and narrow < wider:
                    pressure += s.weight * s.milli * s.count / sum(gpus[m] for m in narrow)
            pressure *= sum(gpus.values()) / mean
        out = self._scarcity[key] = min(1.0, pressure)
        return out

    def landing(self, model: str) -> TargetWorkload | None:
        """The part of this workload that can land on GPUs of `model`, renormalised: the CPU-only shapes
        and the GPU shapes whose models allow it. Itself when every shape may (no shape names models);
        None when nothing can.

        On a mixed fleet a hole on a T4 is filled only by pods that may run on a T4: whether the workload
        will fill it, and how much host CPU comes with each milli sold there, are questions about this
        part, not about pods pinned to other models. Workloads with the same part share one object (and
        its settled-waste table).
        """
        if model in self._landing:
            return self._landing[model]
        kept = tuple(s for s in self.shapes if not s.count or not s.models or model in s.models)
        if len(kept) == len(self.shapes):
            out: TargetWorkload | None = self
        elif not kept:
            out = None
        else:
            total = sum(s.weight for s in kept)
            shapes = tuple(PodShape(s.cpu_milli, s.milli, s.count, s.models, s.weight / total) for s in kept)
            same = next((w for w in self._landing.values() if w is not None and w.shapes == shapes), None)
            out = same if same is not None else TargetWorkload(shapes)
        self._landing[model] = out
        return out

    def settled_for(self, model: str) -> tuple[float, ...]:
        """`settled_waste` of the part of the workload that can land on `model` (V[x] = x when none can)."""
        part = self.landing(model)
        return part.settled_waste() if part is not None else _NOTHING_SETTLES

    def settled_waste(self, pool_gpus: int = SETTLE_POOL_GPUS) -> tuple[float, ...]:
        """V[x]: expected milli still free at saturation on a GPU that once had x free (x = 0..1000).

        FGD asks whether the *next* pod can use a hole; this asks whether the workload will ever fill
        it. A pool of `pool_gpus` single GPUs is fed pods drawn from this workload (sharing pods go to
        the hole FGD's per-GPU rule likes best, whole pods take empty GPUs) until 130 % of its capacity
        has arrived. A hole the workload keeps filling (530 after a 470, when 470s are common) gets a
        small V; one it over-produces (the 190 an 810 leaves) gets V close to its size. Deterministic.
        """
        cached = self._settled.get(pool_gpus)
        if cached is not None:
            return cached
        rng = random.Random(0)
        gpu_shapes = [s for s in self.shapes if s.count]
        weights = [s.weight for s in gpu_shapes]
        # FGD's per-GPU fragment: x counts for every shape that cannot use x free milli.
        frag = [x * sum(s.weight for s in self.shapes if s.count == 0 or s.milli > x) for x in range(1001)]
        by_free: dict[int, list[int]] = {MILLI_PER_GPU: list(range(pool_gpus))}
        free = [MILLI_PER_GPU] * pool_gpus
        visited: list[set[int]] = [{MILLI_PER_GPU} for _ in range(pool_gpus)]
        arrived, target = 0, 1.3 * pool_gpus * MILLI_PER_GPU
        while gpu_shapes and arrived < target:
            shape = rng.choices(gpu_shapes, weights)[0]
            arrived += shape.milli * shape.count
            if shape.milli == MILLI_PER_GPU:
                empty = by_free[MILLI_PER_GPU]
                if len(empty) < shape.count:
                    continue
                chosen = [empty.pop() for _ in range(shape.count)]
            else:
                best: tuple[tuple[int, int], int] | None = None
                for x, gpus in by_free.items():
                    if gpus and x >= shape.milli:
                        score = int(100 / (1 + math.exp(-(frag[x] - frag[x - shape.milli]) / MILLI_PER_GPU)))
                        if best is None or (score, -x) > best[0]:
                            best = ((score, -x), x)
                if best is None:
                    continue
                chosen = [by_free[best[1]].pop()]
            for g in chosen:
                free[g] -= shape.milli
                by_free.setdefault(free[g], []).append(g)
                visited[g].add(free[g])
        total = [0.0] * (MILLI_PER_GPU + 1)
        seen = [0] * (MILLI_PER_GPU + 1)
        for g in range(pool_gpus):
            for x in visited[g]:
                total[x] += free[g]
                seen[x] += 1
        out = tuple(total[x] / seen[x] if seen[x] else float(x) for x in range(MILLI_PER_GPU + 1))
        self._settled[pool_gpus] = out
        return out

    @cached_property
    def cpu_steps(self) -> tuple[int, ...]:
        """The shapes' distinct CPU requests, ascending: free CPU between two steps decides alike."""
        return tuple(sorted({s.cpu_milli for s in self.shapes}))

    @cached_property
    def cpu_per_milli(self) -> float | None:
        """Host CPU milli the workload's GPU pods ask per GPU milli (pod-weighted); None if none or 0."""
        gpu_shapes = [s for s in self.shapes if s.count]
        milli = sum(s.weight * s.milli * s.count for s in gpu_shapes)
        cpu = sum(s.weight * s.cpu_milli for s in gpu_shapes)
        return cpu / milli if milli and cpu else None

    def cpu_per_milli_for(self, model: str) -> float | None:
        """`cpu_per_milli` of the part of the workload that can land on `model`."""
        part = self.landing(model)
        return part.cpu_per_milli if part is not None else None

    def cpu_stranded(self, cpu_left: int | None, lefts: tuple[int, ...], model: str) -> float:
        """Expected GPU milli on a node of `model` that the workload would fill but cannot, for lack of
        host CPU.

        Before they settle, the node's free GPUs take sum(x - V[x]) more milli (V = settled_for(model)),
        and the pods that can land there bring `cpu_per_milli_for(model)` CPU with every GPU milli. The
        part the free CPU cannot cover is stranded: a 96-core 8-GPU node filled with 12-core 470-milli
        pods runs out of CPU with GPUs still empty. FGD sees this only once CPU is below a typical pod's
        request.
        """
        part = self.landing(model)
        ratio = None if part is None else part.cpu_per_milli
        if cpu_left is None or part is None or ratio is None:
            return 0.0
        usable = part._usable.get(lefts)
        if usable is None:
            settled = part.settled_waste()
            usable = sum(x - settled[x] for x in lefts)
            if len(part._usable) >= _MEMO_LIMIT:
                part._usable.clear()
            part._usable[lefts] = usable
        return max(0.0, usable - cpu_left / ratio)

    def node_frag(self, cpu_left: int | None, lefts: tuple[int, ...], model: str) -> float:
        """Expected milli on a node that a random pod of this workload could not use.

        `lefts` are the free milli of the node's usable GPUs, in any order. A shape the node cannot
        host at all (CPU-only, wrong model, not enough room) makes every free milli a fragment; a shape
        it can host makes only the GPUs too small for it fragments.
        """
        # Only which shapes' CPU requests fit matters, not the free CPU itself: one entry per step.
        step = -1 if cpu_left is None else bisect_right(self.cpu_steps, cpu_left)
        key = (step, lefts, model)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        terms = self._frag_terms.get((model, step)) or self._terms_for(model, step)
        ordered = sorted(lefts)
        below = [0, *accumulate(ordered)]  # below[k]: the k smallest free shares together
        total, n = below[-1], len(ordered)
        # Each distinct (milli, count) the node could host: only the GPUs too small for it are fragments,
        # unless too few GPUs are big enough; then (and for every shape it cannot host) every free milli is.
        values = [
            below[k] if n - k >= count else total
            for milli, count in terms.hostable
            for k in (bisect_left(ordered, milli),)
        ]
        values.append(total)
        # Shape order and one multiply-add per shape, as the plain sum over shapes: the same float.
        frag = 0.0
        for weight, pick in terms.shapes:
            frag += weight * values[pick]
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = frag
        return frag

    def _terms_for(self, model: str, step: int) -> _FragTerms:
        """node_frag's shapes for nodes of `model` whose free CPU is at CPU step `step` (-1: not tracked)."""
        hostable: dict[tuple[int, int], int] = {}  # (milli, count) -> its index in values
        picks = []
        for _, milli, count, cpu in self.plan(model):
            # The node has this shape's CPU when the steps up to its request are all within its free CPU.
            if count and (step < 0 or bisect_right(self.cpu_steps, cpu) <= step):
                picks.append(hostable.setdefault((milli, count), len(hostable)))
            else:
                picks.append(-1)  # every free milli: the last value
        last = len(hostable)
        weights = (w for w, _, _, _ in self.plan(model))
        terms = _FragTerms(
            tuple(hostable), tuple((w, last if p < 0 else p) for w, p in zip(weights, picks, strict=True))
        )
        self._frag_terms[(model, step)] = terms
        return terms

    def plan(self, model: str) -> tuple[tuple[float, int, int, int], ...]:
        """(weight, milli, count, cpu) per shape for nodes of `model`; count 0 where it can never fit."""
        plan = self._plans.get(model)
        if plan is None:
            plan = tuple(
                (s.weight, s.milli, s.count if not s.models or model in s.models else 0, s.cpu_milli)
                for s in self.shapes
            )
            self._plans[model] = plan
        return plan


def _sortable(key: ShapeKey) -> tuple[int, int, int, str]:
    return key[0], key[1], key[2], "|".join(sorted(key[3]))


def _shape_errors(s: PodShape) -> Iterable[str]:
    if not 0 <= s.milli <= MILLI_PER_GPU:
        yield f"milli={s.milli}: must be in [0, {MILLI_PER_GPU}]"
    if s.count < 0 or (s.count == 0) != (s.milli == 0):
        yield f"count={s.count}, milli={s.milli}: CPU-only shapes have both 0, GPU shapes both positive"
    if s.cpu_milli < 0:
        yield f"cpu_milli={s.cpu_milli}: must be non-negative"
    if not s.weight > 0:
        yield f"weight={s.weight}: must be positive"


def learned(demands: Iterable[Demand], min_pods: int = MIN_LEARNED_PODS) -> TargetWorkload | None:
    """The workload of `demands` (FGD's construction) with weights rounded to WEIGHT_STEP; None when fewer
    than `min_pods` of them ask for a GPU (the caller then uses the built-in one).

    Deterministic: the same demands in any order give the same shapes and weights.
    """
    demands = list(demands)
    if sum(1 for d in demands if d.count and d.milli is not None) < min_pods:
        return None
    raw = TargetWorkload.from_demands(demands)
    steps = [(s, round(s.weight / WEIGHT_STEP)) for s in raw.shapes]
    kept = [(s, n) for s, n in steps if n > 0] or [max(steps, key=lambda sn: sn[0].weight)]
    total = sum(max(n, 1) for _, n in kept)
    return TargetWorkload(
        tuple(PodShape(s.cpu_milli, s.milli, s.count, s.models, max(n, 1) / total) for s, n in kept)
    )


@cache
def default_workload() -> TargetWorkload:
    """The built-in distribution (app/core/data/typical_pods.json), used when nothing better is known."""
    text = resources.files("app.core.data").joinpath(DEFAULT_FILE).read_text()
    return TargetWorkload.from_json(json.loads(text), source=DEFAULT_FILE)
