"""Take over a pod written for HAMi: its `nvidia.com/gpu` + `gpumem` / `gpumem-percentage` / `gpucores`
resources become our annotations (pure; only when the operator turns on `--hami-takeover`).

HAMi's resources: `nvidia.com/gpu` = number of GPUs (default 1 when a share resource is set alone),
`nvidia.com/gpumem` = MiB per GPU, `nvidia.com/gpumem-percentage` = % of each GPU's memory,
`nvidia.com/gpucores` = % of each GPU's compute. gpupack reserves one quantity per GPU, memory or a
fraction of both, so the first of gpumem → `gpu-memory`, gpumem-percentage → `gpu-fraction`,
gpucores → `gpu-fraction` is used and any other one is dropped with a warning. The HAMi resources are
removed from the container (nothing on the node advertises them), and the rest of the mutation runs as
for a pod that carried the annotations itself.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from app import names, objects, units
from app.errors import RequestError
from app.jsonpointer import pointer

GPU: Final = "nvidia.com/gpu"
MEMORY: Final = "nvidia.com/gpumem"
MEMORY_PERCENTAGE: Final = "nvidia.com/gpumem-percentage"
CORES: Final = "nvidia.com/gpucores"
SHARES: Final = (MEMORY, MEMORY_PERCENTAGE, CORES)  # in the order they are taken
_KEYS: Final = "['nvidia.com/gpumem', 'nvidia.com/gpumem-percentage', 'nvidia.com/gpucores']"
_ASKS: Final = (
    f"has(c.resources) && ((has(c.resources.requests) && c.resources.requests.exists(k, k in {_KEYS})) || "
    f"(has(c.resources.limits) && c.resources.limits.exists(k, k in {_KEYS})))"
)
# The CEL clause the chart ORs into the webhook's matchCondition when webhook.hamiTakeover is on: the pods
# `asks` is true for.
MATCH_CONDITION: Final = (
    f"object.spec.containers.exists(c, {_ASKS}) || "
    f"(has(object.spec.initContainers) && object.spec.initContainers.exists(c, {_ASKS}))"
)
MAX_MEMORY_MIB: Final = 1 << 20  # 1 TiB: a typo guard; our own rule then checks it against real GPUs

Op = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Takeover:
    """The pod as our mutation should see it, the ops that make it so, and what to tell the user."""

    pod: dict[str, Any]
    ops: list[Op]
    warnings: tuple[str, ...]


def asks(pod: Mapping[str, Any]) -> bool:
    """True when a container (init containers included) requests or limits a HAMi share resource."""
    return any(_shares(c) for _, _, c in _containers(objects.as_object(pod.get("spec"))))


def take_over(pod: Mapping[str, Any]) -> Takeover | tuple[RequestError, ...]:
    """Our annotations for a HAMi pod, or why it cannot be taken over (each error names the resource)."""
    spec = objects.as_object(pod.get("spec"))
    asking = [(ptr, where, c) for ptr, where, c in _containers(spec) if _shares(c)]
    if len(asking) > 1:
        which = ", ".join(where for _, where, _ in asking)
        return (
            RequestError(
                f"{asking[1][1]}.resources",
                ", ".join(_shares(asking[1][2])),
                f"gpupack gives one container per pod a GPU share; HAMi resources are requested by {which}",
            ),
        )
    ptr, where, container = asking[0]
    values = _shares(container)
    errors = [err for key, raw in values.items() if (err := _check(where, key, raw)) is not None]
    raw_count = _resource(container, GPU)
    if raw_count is not None and _integer(raw_count, 1, 16) is None:
        errors.append(RequestError(f"{where}.resources[{GPU}]", raw_count, "must be an integer from 1 to 16"))
    if errors:
        return tuple(errors)
    used = next(key for key in SHARES if key in values)
    amount = _integer(values[used], 1, MAX_MEMORY_MIB)
    if used == MEMORY:
        ours = {names.GPU_MEMORY: str(amount)}
    else:
        ours = {names.GPU_FRACTION: _fraction(int(amount or 0))}
    ours[names.GPU_FRACTION_NUM_DEVICES] = str(_integer(raw_count, 1, 16)) if raw_count else "1"
    ours[names.GPU_FRACTION_CONTAINER_NAME] = str(container.get("name"))
    written = ", ".join(
        f"{k}={v}" for k, v in ([(GPU, raw_count)] if raw_count else []) + list(values.items())
    )
    warnings = [
        f"HAMi resources of {where} ({written}) taken over by gpupack: "
        + ", ".join(f"{k}={v!r}" for k, v in ours.items())
    ]
    for key, raw in values.items():
        if key != used:
            warnings.append(
                f"{key}={raw} is not carried over: gpupack reserves one share per GPU, from {used}"
            )
    ops = _annotation_ops(objects.as_object(pod.get("metadata")), ours) + _removal_ops(ptr, container)
    return Takeover(_apply(pod, ptr, ours), ops, tuple(warnings))


def _containers(spec: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    out = []
    for key in ("containers", "initContainers"):
        for i, item in enumerate(objects.as_list(spec.get(key))):
            c = objects.as_object(item)
            out.append((f"/spec/{key}/{i}", f"spec.{key}[{c.get('name')}]", c))
    return out


def _resource(container: Mapping[str, Any], key: str) -> str | None:
    res = objects.as_object(container.get("resources"))
    for part in ("limits", "requests"):
        value = objects.as_object(res.get(part)).get(key)
        if value is not None:
            return str(value)
    return None


def _shares(container: Mapping[str, Any]) -> dict[str, str]:
    return {key: raw for key in SHARES if (raw := _resource(container, key)) is not None}


def _integer(raw: str, low: int, high: int) -> int | None:
    """The whole number a quantity stands for, within [low, high]; the apiserver stores "3000" as "3k"."""
    value = units.quantity_value(raw)
    if value is None or value.denominator != 1 or not low <= value <= high:
        return None
    return int(value)


def _check(where: str, key: str, raw: str) -> RequestError | None:
    if key == MEMORY and _integer(raw, 1, MAX_MEMORY_MIB) is None:
        return RequestError(
            f"{where}.resources[{key}]", raw, "must be a whole number of MiB per GPU, e.g. 4096"
        )
    if key != MEMORY and _integer(raw, 1, 100) is None:
        return RequestError(f"{where}.resources[{key}]", raw, "must be an integer percentage from 1 to 100")
    return None


def _fraction(percent: int) -> str:
    """A HAMi percentage as our gpu-fraction: 30 → "0.3", 100 → "1"."""
    value = (Decimal(percent) / 100).normalize()
    return format(value, "f")


def _annotation_ops(meta: Mapping[str, Any], ours: Mapping[str, str]) -> list[Op]:
    if not meta.get("annotations"):
        return [{"op": "add", "path": "/metadata/annotations", "value": dict(ours)}]
    return [{"op": "add", "path": "/metadata/annotations" + pointer(k), "value": v} for k, v in ours.items()]


def _removal_ops(ptr: str, container: Mapping[str, Any]) -> list[Op]:
    res = objects.as_object(container.get("resources"))
    return [
        {"op": "remove", "path": f"{ptr}/resources/{part}" + pointer(key)}
        for part in ("requests", "limits")
        for key in (GPU, *SHARES)
        if key in objects.as_object(res.get(part))
    ]


def _apply(pod: Mapping[str, Any], ptr: str, ours: Mapping[str, str]) -> dict[str, Any]:
    """The pod after the takeover ops (a copy)."""
    out = copy.deepcopy(dict(pod))
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **ours}
    _, _, key, index = ptr.split("/")
    resources = out["spec"][key][int(index)].get("resources") or {}
    for part in ("requests", "limits"):
        for name in (GPU, *SHARES):
            (resources.get(part) or {}).pop(name, None)
    return out
