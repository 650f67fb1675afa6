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

from app import names, objects, request
from app.errors import RequestError

NO_GPU: Final = "void"  # what the webhook gives every container but the GPU container
GPU_UUIDS_FIELD: Final = f"metadata.annotations['{names.ALLOC_GPU_UUIDS}']"
FIX: Final = (
    f"create the pod with a {names.GPU_FRACTION} or {names.GPU_MEMORY} annotation, "
    "in a namespace the gpupack webhook serves"
)


def unmanaged_errors(pod: Mapping[str, Any]) -> tuple[RequestError, ...]:
    """Every mark of the webhook the pod lacks; empty for a pod the webhook mutated."""
    meta = objects.as_object(pod.get("metadata"))
    spec = objects.as_object(pod.get("spec"))
    errors: list[RequestError] = []
    label = objects.as_object(meta.get("labels")).get(names.LABEL_MANAGED)
    if label != "true":
        errors.append(
            RequestError(
                f"metadata.labels[{names.LABEL_MANAGED}]",
                "" if label is None else str(label),
                f'must be "true" (set by the gpupack webhook); {FIX}',
            )
        )
    errors += _env_errors(spec, _gpu_container(objects.string_map(meta.get("annotations")), spec))
    return tuple(errors)


def unmanaged_reason(pod: Mapping[str, Any]) -> str | None:
    """The scheduler-facing text for `unmanaged_errors`, or None for a gpupack pod."""
    errors = unmanaged_errors(pod)
    if not errors:
        return None
    return "not admitted by the gpupack webhook: " + "; ".join(str(e) for e in errors)


def _gpu_container(annotations: Mapping[str, str], spec: Mapping[str, Any]) -> str | None:
    """The container the request names (gpu-fraction-container-name, else the first regular one);
    None for a pod without a GPU-share annotation."""
    if not request.wants_gpu(annotations):
        return None
    first = [c.name for c in request.containers_of(spec) if not c.init][:1]
    return annotations.get(names.GPU_FRACTION_CONTAINER_NAME) or (first[0] if first else "")


def _env_errors(spec: Mapping[str, Any], target: str | None) -> Iterable[RequestError]:
    for key in ("containers", "initContainers"):
        for item in objects.as_list(spec.get(key)):
            c = objects.as_object(item)
            name = str(c.get("name", ""))
            where = f"{key}[{name}].env[{names.ENV_NVIDIA_VISIBLE_DEVICES}]"
            entry = _last_env(objects.as_list(c.get("env")), names.ENV_NVIDIA_VISIBLE_DEVICES)
            gpu = bool(request.gpupack_resources(objects.as_object(c.get("resources"))))
            if gpu and target is not None and name != target:
                resources = ", ".join(
                    r for r, _ in request.gpupack_resources(objects.as_object(c.get("resources")))
                )
                yield RequestError(
                    f"{key}[{name}].resources",
                    resources,
                    f"only the GPU container ({target!r}) carries a gpupack share; {FIX}",
                )
            elif gpu:  # the GPU container: a regular or an init container (gpu-fraction-container-name)
                if _field_path(entry) != GPU_UUIDS_FIELD:
                    yield RequestError(
                        where, describe_env(entry), f"must be the fieldRef {GPU_UUIDS_FIELD}; {FIX}"
                    )
            elif entry is None or entry.get("value") != NO_GPU or "valueFrom" in entry:
                yield RequestError(
                    where,
                    describe_env(entry),
                    f"must be {NO_GPU!r} in a container without a GPU share, or it may see every GPU; {FIX}",
                )


def _last_env(env: Iterable[Any], name: str) -> Mapping[str, Any] | None:
    """The entry the kubelet applies: the last one with that name."""
    found = None
    for entry in env:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            found = entry
    return found


def _field_path(entry: Mapping[str, Any] | None) -> str | None:
    if entry is None:
        return None
    ref = objects.as_object(objects.as_object(entry.get("valueFrom")).get("fieldRef"))
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
