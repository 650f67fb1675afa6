"""AdmissionReview in, AdmissionReview out: the JSONPatch that makes a GPU-share pod a gpupack pod (pure).

The patch is computed against the pod as it is, op by op, and only for what is missing or different,
so a second pass over an already-mutated pod (reinvocationPolicy: IfNeeded) yields no ops at all.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from app import names, request, units
from app.errors import RequestError
from app.metrics import WebhookOutcome
from app.request import GpuRequest, Isolation
from webhook.settings import Settings

Json = Any  # a decoded JSON value
Op = dict[str, Json]

MPS_VOLUME: Final = "gpupack-mps-pipe"
NO_GPU: Final = "void"  # NVIDIA container toolkit: expose no GPU, even where the image defaults to "all"
_REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one review: the AdmissionReview to send back, plus what to log and count."""

    outcome: WebhookOutcome
    response: dict[str, Json]
    messages: tuple[str, ...] = ()  # denial reasons or warnings
    ops: int = 0  # number of JSONPatch operations


def review(body: Mapping[str, Json], settings: Settings) -> dict[str, Json]:
    """An AdmissionReview request (dict) → the AdmissionReview response (dict)."""
    return decide(body, settings).response


def decide(body: Mapping[str, Json], settings: Settings) -> Decision:
    req = body.get("request") or {}
    uid = req.get("uid", "")
    pod = req.get("object")
    kind = req.get("kind") or {}
    is_pod = kind.get("group", "") == "" and kind.get("kind") == "Pod"
    if req.get("operation") != "CREATE" or not is_pod or not isinstance(pod, Mapping):
        return Decision(WebhookOutcome.SKIPPED, _answer(uid, {"allowed": True}))
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    containers = request.containers_of(pod.get("spec") or {})
    if not request.wants_gpu(annotations):
        # Our resources without our annotations: refused, never guessed (see README, "Requesting GPUs").
        if errors := request.unannotated_errors(containers):
            return _deny(uid, errors)
        return Decision(WebhookOutcome.SKIPPED, _answer(uid, {"allowed": True}))

    parsed = request.parse(annotations, containers)
    if isinstance(parsed, tuple):
        return _deny(uid, parsed)

    ops = pod_patch(pod, parsed, settings)
    response: dict[str, Json] = {"allowed": True}
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(ops, separators=(",", ":")).encode()).decode()
    if parsed.warnings:
        response["warnings"] = list(parsed.warnings)
    return Decision(WebhookOutcome.MUTATED, _answer(uid, response), parsed.warnings, len(ops))


def _deny(uid: str, errors: Sequence[RequestError]) -> Decision:
    messages = tuple(str(err) for err in errors)
    status = {"status": "Failure", "code": 422, "reason": "Invalid", "message": "; ".join(messages)}
    return Decision(WebhookOutcome.DENIED, _answer(uid, {"allowed": False, "status": status}), messages)


def _answer(uid: str, response: dict[str, Json]) -> dict[str, Json]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, **response},
    }


def pod_patch(pod: Mapping[str, Json], req: GpuRequest, settings: Settings) -> list[Op]:
    """The JSONPatch ops that bring `pod` in line with `req`; empty when it already is."""
    spec = pod["spec"]
    mps = req.isolation is Isolation.MPS
    ops = _label_ops(pod.get("metadata") or {})
    for i, container in enumerate(spec["containers"]):
        path = f"/spec/containers/{i}"
        if container["name"] == req.container:
            ops += _list_ops(path, container, "env", gpu_env(req))
            ops += _resource_ops(path, container, req)
            if mps:
                mount = {"name": MPS_VOLUME, "mountPath": names.MPS_PIPE_DIRECTORY}
                ops += _list_ops(path, container, "volumeMounts", [mount])
        else:
            ops += _list_ops(path, container, "env", [_value(names.ENV_NVIDIA_VISIBLE_DEVICES, NO_GPU)])
    for i, container in enumerate(spec.get("initContainers") or ()):
        ops += _list_ops(
            f"/spec/initContainers/{i}", container, "env", [_value(names.ENV_NVIDIA_VISIBLE_DEVICES, NO_GPU)]
        )
    if mps:
        volume = {
            "name": MPS_VOLUME,
            "hostPath": {"path": settings.mps_pipe_host_dir, "type": "DirectoryOrCreate"},
        }
        ops += _list_ops("/spec", spec, "volumes", [volume])
    ops += _affinity_ops(spec, node_requirements(req))
    if settings.scheduler_name and spec.get("schedulerName") != settings.scheduler_name:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": settings.scheduler_name})
    return ops


def gpu_env(req: GpuRequest) -> list[dict[str, Json]]:
    """Env for the GPU container. Values come from the allocation annotations the extender writes at bind.

    Both *_VISIBLE_DEVICES use the GPU UUIDs: the toolkit renumbers the devices it exposes from 0, so
    a host index in CUDA_VISIBLE_DEVICES would name the wrong GPU, while CUDA accepts UUIDs either way.
    A missing annotation resolves to "", which both read as "no GPU" (fails closed).
    """
    env = [
        _field(names.ENV_NVIDIA_VISIBLE_DEVICES, names.ALLOC_GPU_UUIDS),
        _field(names.ENV_CUDA_VISIBLE_DEVICES, names.ALLOC_GPU_UUIDS),
        _field(names.ENV_MEMORY_LIMIT_MIB, names.ALLOC_MEMORY_LIMIT_MIB),
    ]
    if req.isolation is Isolation.MPS:
        # Without MPS these would be inert, and without the pipe mount the client cannot reach a daemon.
        env += [
            _field(names.ENV_MPS_THREAD_PERCENTAGE, names.ALLOC_THREAD_PERCENTAGE),
            _field(names.ENV_MPS_MEMORY_LIMIT, names.ALLOC_MPS_MEMORY_LIMIT),
            _value(names.ENV_MPS_PIPE_DIRECTORY, names.MPS_PIPE_DIRECTORY),
        ]
    return env


def node_requirements(req: GpuRequest) -> list[dict[str, Json]]:
    """Required node-affinity expressions, so kube-scheduler drops impossible nodes before the extender."""
    out: list[dict[str, Json]] = [{"key": names.NODE_LABEL_ENABLED, "operator": "In", "values": ["true"]}]
    if req.memory_mib is not None:
        # Gt is strict: the node's largest GPU must have at least memory_mib.
        limit = str(req.memory_mib - 1)
        out.append({"key": names.NODE_LABEL_GPU_MEMORY_MAX_MIB, "operator": "Gt", "values": [limit]})
    if req.models:
        out.append({"key": names.NODE_LABEL_GPU_MODEL, "operator": "In", "values": list(req.models)})
    return out


# --- op builders: each adds only what is missing, at the shallowest path that does not exist yet ---


def _pointer(*parts: str) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _field(name: str, annotation: str) -> dict[str, Json]:
    # apiVersion is written out because the apiserver defaults it; a reinvocation then sees an exact match.
    ref = {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{annotation}']"}
    return {"name": name, "valueFrom": {"fieldRef": ref}}


def _value(name: str, value: str) -> dict[str, Json]:
    return {"name": name, "value": value}


def _covers(have: Json, want: Json) -> bool:
    """True when `have` already says everything `want` says (extra fields, e.g. defaults, are fine)."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(k in have and _covers(have[k], v) for k, v in want.items())
    return bool(have == want)


def _label_ops(meta: Mapping[str, Json]) -> list[Op]:
    labels = meta.get("labels")
    if not labels:
        return [{"op": "add", "path": "/metadata/labels", "value": {names.LABEL_MANAGED: "true"}}]
    if labels.get(names.LABEL_MANAGED) != "true":
        return [{"op": "add", "path": "/metadata/labels" + _pointer(names.LABEL_MANAGED), "value": "true"}]
    return []


def _list_ops(path: str, parent: Mapping[str, Json], key: str, wanted: Sequence[dict[str, Json]]) -> list[Op]:
    """Make each wanted item (keyed by "name") present in parent[key]: add it, or replace a stale one."""
    items = parent.get(key)
    if not items:
        return [{"op": "add", "path": f"{path}/{key}", "value": list(wanted)}]
    # The last entry with a name is the one that takes effect (env), so that is the one to compare.
    index = {item.get("name"): i for i, item in enumerate(items)}
    ops: list[Op] = []
    for item in wanted:
        i = index.get(item["name"])
        if i is None:
            ops.append({"op": "add", "path": f"{path}/{key}/-", "value": item})
        elif not _covers(items[i], item):
            ops.append({"op": "replace", "path": f"{path}/{key}/{i}", "value": item})
    return ops


def _same_quantity(have: Json, want: int) -> bool:
    return units.quantity_value(str(have)) == want


def _resource_ops(path: str, container: Mapping[str, Json], req: GpuRequest) -> list[Op]:
    """Request and limit our extended resource (they must be equal); drop the other one a stale pass set."""
    name, amount = req.resource
    other = names.RESOURCE_GPU_MEMORY_MIB if name == names.RESOURCE_GPU_MILLI else names.RESOURCE_GPU_MILLI
    resources = container.get("resources")
    if not resources:
        value = {"requests": {name: str(amount)}, "limits": {name: str(amount)}}
        return [{"op": "add", "path": f"{path}/resources", "value": value}]
    ops: list[Op] = []
    for part in ("requests", "limits"):
        current = resources.get(part)
        if not current:
            ops.append({"op": "add", "path": f"{path}/resources/{part}", "value": {name: str(amount)}})
            continue
        if other in current:
            ops.append({"op": "remove", "path": f"{path}/resources/{part}" + _pointer(other)})
        if not _same_quantity(current.get(name), amount):
            ops.append(
                {"op": "add", "path": f"{path}/resources/{part}" + _pointer(name), "value": str(amount)}
            )
    return ops


def _affinity_ops(spec: Mapping[str, Json], wanted: list[dict[str, Json]]) -> list[Op]:
    """AND our expressions into every required nodeSelectorTerm; never replace or drop a user's term."""
    term: Json = {"matchExpressions": wanted}
    affinity = spec.get("affinity")
    if not affinity:
        return [
            {
                "op": "add",
                "path": "/spec/affinity",
                "value": {"nodeAffinity": {_REQUIRED: {"nodeSelectorTerms": [term]}}},
            }
        ]
    node_affinity = affinity.get("nodeAffinity")
    if not node_affinity:
        return [
            {
                "op": "add",
                "path": "/spec/affinity/nodeAffinity",
                "value": {_REQUIRED: {"nodeSelectorTerms": [term]}},
            }
        ]
    required = node_affinity.get(_REQUIRED)
    path = f"/spec/affinity/nodeAffinity/{_REQUIRED}"
    if not required:
        return [{"op": "add", "path": path, "value": {"nodeSelectorTerms": [term]}}]
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return [{"op": "add", "path": f"{path}/nodeSelectorTerms", "value": [term]}]
    ops: list[Op] = []
    for i, user_term in enumerate(terms):
        term_path = f"{path}/nodeSelectorTerms/{i}"
        have = (user_term or {}).get("matchExpressions") or []
        missing = [w for w in wanted if not any(_covers(h, w) for h in have)]
        if not missing:
            continue
        if user_term is None:
            ops.append({"op": "replace", "path": term_path, "value": {"matchExpressions": missing}})
        elif not have:
            ops.append({"op": "add", "path": f"{term_path}/matchExpressions", "value": missing})
        else:
            ops += [{"op": "add", "path": f"{term_path}/matchExpressions/-", "value": w} for w in missing]
    return ops
