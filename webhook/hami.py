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

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from app.core import names, units
from app.core.errors import RequestError
from app.core.jsonpointer import pointer
from app.core.podview import WHOLE_GPU_RESOURCE, ContainerView, PodView

GPU: Final = WHOLE_GPU_RESOURCE
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

    pod: PodView
    ops: list[Op]
    warnings: tuple[str, ...]


def asks(pod: PodView) -> bool:
    """True when a container (init containers included) requests or limits a HAMi share resource."""
    return any(_shares(c) for c in pod.containers)


def take_over(pod: PodView) -> Takeover | tuple[RequestError, ...]:
    """Our annotations for a HAMi pod, or why it cannot be taken over (each error names the resource)."""
    asking = [c for c in pod.containers if _shares(c)]
    if len(asking) > 1:
        which = ", ".join(c.where for c in asking)
        return (
            RequestError(
                f"{asking[1].where}.resources",
                ", ".join(_shares(asking[1])),
                f"gpupack gives one container per pod a GPU share; HAMi resources are requested by {which}",
            ),
        )
    container = asking[0]
    where = container.where
    values = _shares(container)
    amounts = {key: _share(where, key, raw) for key, raw in values.items()}
    errors = [err for err in amounts.values() if isinstance(err, RequestError)]
    raw_count = container.resource(GPU)
    count = 1 if raw_count is None else _integer(raw_count, 1, 16)
    if count is None:
        errors.append(
            RequestError(f"{where}.resources[{GPU}]", str(raw_count), "must be an integer from 1 to 16")
        )
    if errors or count is None:
        return tuple(errors)
    used = next(key for key in SHARES if key in values)
    amount = amounts[used]
    assert not isinstance(amount, RequestError)
    ours = {names.GPU_MEMORY: str(amount)} if used == MEMORY else {names.GPU_FRACTION: _fraction(amount)}
    ours[names.GPU_FRACTION_NUM_DEVICES] = str(count)
    ours[names.GPU_FRACTION_CONTAINER_NAME] = container.name
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
    ops = _annotation_ops(pod.annotations, ours) + _removal_ops(container)
    return Takeover(pod.with_takeover(ours, container.without((GPU, *SHARES))), ops, tuple(warnings))


def _shares(container: ContainerView) -> dict[str, str]:
    return {key: raw for key in SHARES if (raw := container.resource(key)) is not None}


def _integer(raw: str, low: int, high: int) -> int | None:
    """The whole number a quantity stands for, within [low, high]; the apiserver stores "3000" as "3k"."""
    value = units.quantity_value(raw)
    if value is None or value.denominator != 1 or not low <= value <= high:
        return None
    return int(value)


def _share(where: str, key: str, raw: str) -> int | RequestError:
    """A HAMi share's amount (MiB for gpumem, else a percentage), or why it is not one."""
    if key == MEMORY:
        mib = _integer(raw, 1, MAX_MEMORY_MIB)
        return (
            RequestError(f"{where}.resources[{key}]", raw, "must be a whole number of MiB per GPU, e.g. 4096")
            if mib is None
            else mib
        )
    percent = _integer(raw, 1, 100)
    if percent is None:
        return RequestError(f"{where}.resources[{key}]", raw, "must be an integer percentage from 1 to 100")
    return percent


def _fraction(percent: int) -> str:
    """A HAMi percentage as our gpu-fraction: 30 → "0.3", 100 → "1"."""
    value = (Decimal(percent) / 100).normalize()
    return format(value, "f")


def _annotation_ops(annotations: Mapping[str, str], ours: Mapping[str, str]) -> list[Op]:
    if not annotations:
        return [{"op": "add", "path": "/metadata/annotations", "value": dict(ours)}]
    return [{"op": "add", "path": "/metadata/annotations" + pointer(k), "value": v} for k, v in ours.items()]


def _removal_ops(container: ContainerView) -> list[Op]:
    return [
        {"op": "remove", "path": f"{container.pointer}/resources/{part}" + pointer(key)}
        for part, have in (("requests", container.requests), ("limits", container.limits))
        for key in (GPU, *SHARES)
        if key in have
    ]
