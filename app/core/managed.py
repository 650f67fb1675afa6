"""Did the gpupack webhook admit this pod? The extender places only pods that carry its marks (pure).

A pod can reach the extender without the webhook: one created where the webhook does not run (its
excluded namespaces), or while it was not registered. Such a pod has no `gpupack.io/managed` label, so
the extender's informer would never see it and its share would be forgotten once the bind hold expires;
and without the webhook's env, a CUDA image's default `NVIDIA_VISIBLE_DEVICES=all` would expose every
GPU of the node. So the extender refuses it, with the reasons below, instead of placing it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from app.core import names
from app.core.errors import RequestError
from app.core.objects import as_object
from app.core.podview import PodView

GPU_UUIDS_FIELD: Final = f"metadata.annotations['{names.ALLOC_GPU_UUIDS}']"
FIX: Final = (
    f"create the pod with a {names.GPU_FRACTION} or {names.GPU_MEMORY} annotation, "
    "in a namespace the gpupack webhook serves"
)


def unmanaged_errors(pod: PodView) -> tuple[RequestError, ...]:
    """Every mark of the webhook the pod lacks; empty for a pod the webhook mutated."""
    errors: list[RequestError] = []
    label = pod.labels.get(names.LABEL_MANAGED)
    if label != "true":
        errors.append(
            RequestError(
                f"metadata.labels[{names.LABEL_MANAGED}]",
                "" if label is None else label,
                f'must be "true" (set by the gpupack webhook); {FIX}',
            )
        )
    # The container the request names; None for a pod without a GPU-share annotation.
    target = (pod.gpu_container or "") if pod.ask.wanted else None
    errors += _env_errors(pod, target)
    return tuple(errors)


def unmanaged_reason(pod: PodView) -> str | None:
    """The scheduler-facing text for `unmanaged_errors`, or None for a gpupack pod."""
    errors = unmanaged_errors(pod)
    if not errors:
        return None
    return "not admitted by the gpupack webhook: " + "; ".join(str(e) for e in errors)


def _env_errors(pod: PodView, target: str | None) -> Iterable[RequestError]:
    for c in pod.containers:
        key = c.kind.value
        where = f"{key}[{c.name}].env[{names.ENV_NVIDIA_VISIBLE_DEVICES}]"
        entry = c.env.get(names.ENV_NVIDIA_VISIBLE_DEVICES)
        if c.ours and target is not None and c.name != target:
            yield RequestError(
                f"{key}[{c.name}].resources",
                ", ".join(r for r, _ in c.ours),
                f"only the GPU container ({target!r}) carries a gpupack share; {FIX}",
            )
        elif c.ours:  # the GPU container: a regular or an init container (gpu-fraction-container-name)
            if _field_path(entry) != GPU_UUIDS_FIELD:
                yield RequestError(
                    where, describe_env(entry), f"must be the fieldRef {GPU_UUIDS_FIELD}; {FIX}"
                )
        elif entry is None or entry.get("value") != names.NO_GPU or "valueFrom" in entry:
            yield RequestError(
                where,
                describe_env(entry),
                f"must be {names.NO_GPU!r} in a container without a GPU share, or it may see every GPU; "
                + FIX,
            )


def _field_path(entry: Mapping[str, Any] | None) -> str | None:
    if entry is None:
        return None
    ref = as_object(as_object(entry.get("valueFrom")).get("fieldRef"))
    return str(ref["fieldPath"]) if "fieldPath" in ref else None


def describe_env(entry: Mapping[str, Any] | None) -> str:
    """An env entry as a message shows it: its value, its fieldRef, or `<unset>`."""
    if entry is None:
        return "<unset>"
    if (path := _field_path(entry)) is not None:
        return f"fieldRef {path}"
    if "valueFrom" in entry:
        return "valueFrom"
    return str(entry.get("value", ""))
