"""AdmissionReview in, AdmissionReview out: the JSONPatch that makes a GPU-share pod a gpupack pod (pure).

The patch is computed against the pod as it is, op by op, and only for what is missing or different,
so a second pass over an already-mutated pod (reinvocationPolicy: IfNeeded) yields no ops at all.
"""

from __future__ import annotations

import base64
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, NamedTuple, TypeVar

import pydantic_core

from app.core import allocenv, managed, names, nearmiss, podview, quota, request, units
from app.core.errors import RequestError
from app.core.jsonpointer import pointer
from app.core.podview import ContainerView, PodView
from app.core.quota import Fleet
from app.core.request import GpuRequest, Isolation
from webhook import disruption, hami, pipe, podsecurity
from webhook.metrics import WebhookOutcome
from webhook.schemas import AdmissionReview
from webhook.settings import Settings

Json = Any  # a decoded JSON value
Op = dict[str, Json]
# What the patch writes for the pipe dir of each GPU container (by JSON pointer), or why it cannot; none
# at all without MPS.
Plans = Mapping[str, pipe.Writes | RequestError]

MPS_VOLUME: Final = pipe.VOLUME
_REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one review: the AdmissionReview to send back, plus what to log and count."""

    outcome: WebhookOutcome
    response: dict[str, Json]
    messages: tuple[str, ...] = ()  # denial reasons or warnings
    ops: int = 0  # number of JSONPatch operations


def review(
    body: Mapping[str, Json], settings: Settings, pod_security: str | None = None, fleet: Fleet | None = None
) -> dict[str, Json]:
    """An AdmissionReview request (dict, validated here) → the AdmissionReview response (dict)."""
    return decide(AdmissionReview.model_validate(body), settings, pod_security, fleet).response


def decide(
    review: AdmissionReview, settings: Settings, pod_security: str | None = None, fleet: Fleet | None = None
) -> Decision:
    """`pod_security`: the Pod Security level the pod's namespace enforces, where the configuration says
    (see webhook.podsecurity); an MPS share is refused where that level forbids its pipe mount. `fleet`: the
    GPUs the cluster has, as webhook.fleet read them (None: none known, only the settings' fallback)."""
    req = review.request
    uid = req.uid
    is_pod = req.kind.group == "" and req.kind.kind == "Pod"
    if req.operation != "CREATE" or not is_pod or req.object is None:
        return Decision(WebhookOutcome.SKIPPED, _answer(uid, {"allowed": True}))
    pod = podview.read(req.object)  # its shape was checked with the review (schemas.Pod)
    taken: list[Op] = []
    told: tuple[str, ...] = ()
    if settings.hami_takeover and not pod.ask.wanted and hami.asks(pod):
        takeover = hami.take_over(pod)
        if isinstance(takeover, tuple):
            return _deny(uid, takeover)
        pod, taken, told = takeover.pod, takeover.ops, takeover.warnings
    wanted = pod.ask.wanted
    # Keys gpupack does not read that look like ones it does: said, never acted on (app.core.nearmiss).
    told += nearmiss.warnings(pod.annotations, wanted)
    if not wanted:
        # Our resources without our annotations: refused, never guessed (see README, "Requesting GPUs").
        if errors := request.unannotated_errors(pod):
            return _deny(uid, errors, told)
        answer = {"allowed": True, **({"warnings": list(told)} if told else {})}
        return Decision(WebhookOutcome.SKIPPED, _answer(uid, answer), told)

    parsed = request.parse(pod)
    if isinstance(parsed, tuple):
        return _deny(uid, parsed, told)
    if fleet is None:
        fleet = Fleet(fallback_memory_mib=settings.quota_gpu_memory_mib)
    made = patch(pod, parsed, settings, fleet)
    if pod_security and (
        refused := podsecurity.refusal(parsed, pod.annotations, pod_security, req.namespace, made.pipe)
    ):
        return _deny(uid, (refused,), told)
    if isinstance(made.ops, tuple):
        return _deny(uid, made.ops, told)
    warnings = told + parsed.warnings
    response: dict[str, Json] = {"allowed": True}
    if taken:  # the HAMi take-over's ops come first (rare: encoded here, not kept)
        response["patchType"] = "JSONPatch"
        response["patch"] = _encoded(taken + made.ops)
    elif made.ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = made.encoded
    if warnings:
        response["warnings"] = list(warnings)
    return Decision(WebhookOutcome.MUTATED, _answer(uid, response), warnings, len(taken) + len(made.ops))


@dataclass(frozen=True, slots=True)
class Patch:
    """What the mutation writes into one kind of pod: the GPU container's pipe plan (Pod Security reads it)
    and the JSONPatch ops, encoded as the response carries them; or what it would have to overwrite."""

    pipe: pipe.Writes | RequestError | None
    ops: list[Op] | tuple[RequestError, ...]  # only ever read: the pods of that kind share it
    encoded: str = ""  # base64 of the ops' JSON ("" when refused)


def patch(pod: PodView, req: GpuRequest, settings: Settings, fleet: Fleet) -> Patch:
    """`pipe_plans` and `changes` for `pod`, worked out once per `patch_key`: the replicas of a workload
    are one kind of pod, and get one patch from a bounded table."""
    key = patch_key(pod, req, settings, fleet)
    made = _PATCHES.get(key)
    if made is None:
        plans = pipe_plans(pod, req, settings)
        ops = changes(pod, req, plans, settings, fleet)
        encoded = "" if isinstance(ops, tuple) else _encoded(ops)
        made = _PATCHES.keep(key, Patch(next(iter(plans.values()), None), ops, encoded))
    return made


_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


class _Kept(dict[_K, _V]):
    """A bounded table of values worked out once per key: when full, the oldest entry goes (a cluster runs
    far fewer kinds of GPU pod than it holds)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def keep(self, key: _K, value: _V) -> _V:
        if len(self) >= self.size:
            del self[next(iter(self))]
        self[key] = value
        return value


_PATCHES: Final[_Kept[Hashable, Patch]] = _Kept(1024)
_AFFINITY_OPS: Final[_Kept[Hashable, list[Op]]] = _Kept(1024)


def forget_kinds() -> None:
    """Empty the tables kept per kind of pod: each next review is then answered as a first one is (what
    tests compare the tables' answers with)."""
    _PATCHES.clear()
    _AFFINITY_OPS.clear()
    _resources.cache_clear()


def _encoded(ops: list[Op]) -> str:
    # pydantic's Rust JSON encoder: the same compact bytes as json.dumps, a fifth of the CPU.
    return base64.b64encode(pydantic_core.to_json(ops)).decode()


def patch_key(pod: PodView, req: GpuRequest, settings: Settings, fleet: Fleet) -> Hashable:
    """Everything `pipe_plans` and `changes` read, as one value: equal keys give equal patches.

    The request, the fleet and the settings the patch reads; whether the pod has labels and our label's
    value; whether it has annotations and which autoscaler annotation it sets; each container's kind, name
    and place (the order), and its NVIDIA_VISIBLE_DEVICES entry, or for the GPU container its whole env,
    resources and mounts; the volumes, runtimeClassName, affinity and schedulerName. What the patch starts
    to read goes here too (tests/unit/test_webhook_patch_key.py changes one input at a time).
    """
    labels, annotations, gpu = pod.labels, pod.annotations, req.container
    return (
        req,
        fleet,
        settings.scheduler_name,
        settings.mps_pipe_host_dir,
        settings.runtime_class,
        bool(labels),
        labels.get(names.LABEL_MANAGED),
        bool(annotations),
        tuple(key in annotations for key in disruption.ANNOTATIONS),
        tuple(
            (c.kind, c.name, c.has_resources, exact((c.env, c.requests, c.limits)), c.mounts)
            if c.name == gpu
            else (c.kind, c.name, exact(c.env.get(names.ENV_NVIDIA_VISIBLE_DEVICES)) if c.env else None)
            for c in pod.containers  # in order: a container's place in its list is its position
        ),
        pod.volumes,
        pod.runtime_class_name,
        exact(pod.affinity),
        pod.scheduler_name,
    )


def exact(value: Json) -> str:
    """A decoded JSON value as a string equal only to that of an equal value of the same types: objects and
    arrays in order, a number or bool as its type writes it (1, 1.0 and True differ in a message). repr: it
    tells apart all that JSON can, and a tuple from a list; five times cheaper than building nested tuples."""
    return repr(value)


def _deny(uid: str, errors: Sequence[RequestError], warnings: Sequence[str] = ()) -> Decision:
    """A denial naming every error; `warnings` ride along (kubectl prints them with the error)."""
    messages = tuple(str(err) for err in errors)
    status = {"status": "Failure", "code": 422, "reason": "Invalid", "message": "; ".join(messages)}
    answer: dict[str, Json] = {"allowed": False, "status": status}
    if warnings:
        answer["warnings"] = list(warnings)
    return Decision(WebhookOutcome.DENIED, _answer(uid, answer), messages)


def _answer(uid: str, response: dict[str, Json]) -> dict[str, Json]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, **response},
    }


def pipe_plans(pod: PodView, req: GpuRequest, settings: Settings) -> Plans:
    """The pipe plan of the GPU container (of each container of that name), made once per review."""
    if req.isolation is not Isolation.MPS:
        return {}
    host_dir, runtime_class = settings.mps_pipe_host_dir, settings.runtime_class
    out: dict[str, pipe.Writes | RequestError] = {}
    for c in pod.containers:
        if c.name == req.container:
            planned = pipe.plan(pod, c, host_dir)
            out[c.pointer] = (
                planned
                if isinstance(planned, RequestError)
                else pipe.writes(planned, host_dir, runtime_class)
            )
    return out


def changes(
    pod: PodView, req: GpuRequest, plans: Plans, settings: Settings, fleet: Fleet = quota.UNKNOWN_FLEET
) -> list[Op] | tuple[RequestError, ...]:
    """The JSONPatch ops that bring `pod` in line with `req` (empty when it already is), or what in the pod
    the mutation would have to overwrite or duplicate: we refuse rather than do either.

    - An env var we set, written by the user with another value (the last entry of a name is the one
      that counts): overwriting it would silently change their pod, keeping it would break the share.
    - A mount of some other volume where the GPU container's MPS pipe mount goes (see webhook.pipe).
    - A runtimeClassName of the pod's own where an MPS share needs gpupack's RuntimeClass.

    One pass over the containers finds both; the ops are dropped when there is anything to refuse.
    """
    errors: list[RequestError] = []
    ops = _label_ops(pod.labels) + disruption.annotation_ops(pod.annotations)
    pod_ops: list[Op] = []
    for c in pod.containers:
        if c.name != req.container:
            ops += _env_ops(c, _NO_GPU_ENV, req, errors)
            continue
        pipe_dir = names.MPS_PIPE_DIRECTORY
        wrote = plans.get(c.pointer)
        if isinstance(wrote, RequestError):
            errors.append(wrote)
            wrote = None
        elif wrote is not None:
            pipe_dir = wrote.pipe_dir
            if clash := pipe.runtime_class_clash(pod, wrote):
                errors.append(clash)
        env = _gpu_env_entries(req.burstable, req.isolation is Isolation.MPS, pipe_dir)
        ops += _env_ops(c, env, req, errors)
        if errors:
            continue  # refused: the ops are not needed, only every error
        ops += _resource_ops(c, req, fleet)
        if wrote is not None:
            mount_ops, pod_ops = pipe.ops(wrote, pod, c)
            ops += mount_ops
    if errors:
        return tuple(errors)
    ops += pod_ops
    ops += _affinity_patch(pod.affinity, req)
    if settings.scheduler_name and pod.scheduler_name != settings.scheduler_name:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": settings.scheduler_name})
    return ops


def _env_ops(
    c: ContainerView, wanted: Sequence[dict[str, Json]], req: GpuRequest, errors: list[RequestError]
) -> list[Op]:
    """Append each wanted env var that the container lacks; never touch the user's entries. An entry of
    that name with other content is a clash, added to `errors`."""
    if not c.env:
        return [{"op": "add", "path": f"{c.pointer}/env", "value": list(wanted)}]
    have, path = c.env, f"{c.pointer}/env/-"
    ops: list[Op] = []
    for item in wanted:
        entry = have.get(item["name"])
        if entry is None:
            ops.append({"op": "add", "path": path, "value": item})
        elif not _covers(entry, item):
            errors.append(_env_clash(c, item, entry, req))
    return ops


def _env_clash(c: ContainerView, item: dict[str, Json], entry: Json, req: GpuRequest) -> RequestError:
    if c.name != req.container:
        rule = (
            f"must be {names.NO_GPU!r} or unset: only the GPU container ({req.container!r}) gets a GPU, "
            "and gpupack sets it so this one sees none; remove it"
        )
    elif item["name"] == names.ENV_MPS_PIPE_DIRECTORY:
        rule = (
            f"must be {item['value']!r} or unset: gpupack points it at the container's mount of the "
            "node's MPS pipe directory; remove it"
        )
    else:
        rule = (
            "is set by gpupack on the GPU container from the pod's allocation (the gpupack.io/* "
            "annotations written when it is scheduled); remove it"
        )
    return RequestError(f"{c.where}.env[{item['name']}]", managed.describe_env(entry), rule)


def gpu_env(req: GpuRequest, pipe_dir: str = names.MPS_PIPE_DIRECTORY) -> list[dict[str, Json]]:
    """Env for the GPU container (app.core.allocenv): fieldRefs to the allocation annotations the extender
    writes at bind, and the MPS pipe directory `pipe_dir` where the container mounts it."""
    return list(_gpu_env_entries(req.burstable, req.isolation is Isolation.MPS, pipe_dir))


@lru_cache(maxsize=64)
def _gpu_env_entries(burstable: bool, mps: bool, pipe_dir: str) -> tuple[dict[str, Json], ...]:
    # Nearly every review has one of a few (burstable, mps, pipe dir) combinations (a pipe dir other than
    # the default is a user's own mount path, hence a bounded cache), so the entries are built once and
    # reused; they are only read (compared, or serialised into the patch), never changed.
    table = allocenv.gpu_env(burstable=burstable, mps=mps, pipe_dir=pipe_dir)
    return tuple(_field(v.name, v.annotation) if v.annotation else _value(v.name, v.value) for v in table)


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


def _field(name: str, annotation: str) -> dict[str, Json]:
    # apiVersion is written out because the apiserver defaults it; a reinvocation then sees an exact match.
    ref = {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{annotation}']"}
    return {"name": name, "valueFrom": {"fieldRef": ref}}


def _value(name: str, value: str) -> dict[str, Json]:
    return {"name": name, "value": value}


# What every container but the GPU one gets: no GPU (read only, as the GPU container's cached entries).
_NO_GPU_ENV: Final = (_value(names.ENV_NVIDIA_VISIBLE_DEVICES, names.NO_GPU),)


def _covers(have: Json, want: Json) -> bool:
    """True when `have` already says everything `want` says (extra fields, e.g. defaults, are fine)."""
    # `want` is always gpupack's own value (dicts, lists, strings): a dict check, not the slower Mapping one.
    if isinstance(want, dict):
        return isinstance(have, Mapping) and all(k in have and _covers(have[k], v) for k, v in want.items())
    return bool(have == want)


def _label_ops(labels: Mapping[str, str]) -> list[Op]:
    if not labels:
        return [{"op": "add", "path": "/metadata/labels", "value": {names.LABEL_MANAGED: "true"}}]
    if labels.get(names.LABEL_MANAGED) != "true":
        return [{"op": "add", "path": "/metadata/labels" + pointer(names.LABEL_MANAGED), "value": "true"}]
    return []


def _same_quantity(have: Json, want: int) -> bool:
    return have is not None and units.quantity_value(str(have)) == want


def gpu_resources(req: GpuRequest, fleet: Fleet = quota.UNKNOWN_FLEET) -> dict[str, int]:
    """Every gpupack resource the GPU container requests: the one placement reads, and the quota charge."""
    name, amount = req.resource
    return {name: amount, **quota.charge(req, fleet).resources()}


@dataclass(frozen=True, slots=True)
class _Resources:
    """The gpupack resources a request writes on the GPU container, in each form the patch needs."""

    amounts: Mapping[str, int]  # by resource name
    quantities: Mapping[str, str]  # the same, as the quantities written
    escaped: tuple[tuple[str, str, int], ...]  # (resource name, "/" + its JSON-pointer segment, amount)


class _Asked(NamedTuple):
    """All that `gpu_resources` reads of a request: the amounts asked and the models allowed."""

    devices: int  # the request's count
    milli: int | None
    memory_mib: int | None
    mig_profile: str
    models: tuple[str, ...]

    @classmethod
    def of(cls, req: GpuRequest) -> _Asked:
        return cls(req.count, req.milli, req.memory_mib, req.mig_profile, req.models)


@lru_cache(maxsize=256)
def _resources(asks: _Asked, fleet: Fleet) -> _Resources:
    # Worked out once per amount asked and fleet, not per request: pods asking alike with other container
    # names or warnings share it. Only ever read, like the env entries.
    asked = GpuRequest("", asks.devices, asks.milli, asks.memory_mib, asks.mig_profile, asks.models)
    amounts = gpu_resources(asked, fleet)
    quantities = {k: str(v) for k, v in amounts.items()}
    return _Resources(amounts, quantities, tuple((k, pointer(k), v) for k, v in amounts.items()))


def _resource_ops(c: ContainerView, req: GpuRequest, fleet: Fleet) -> list[Op]:
    """Request and limit our extended resources (they must be equal), with the values the request implies.

    gpupack.io/* resources are the webhook's to set: any other one on the GPU container (the other kind a
    stale pass set, a charge the user wrote to shrink their quota use) is removed, a wrong value replaced.
    """
    wanted = _resources(_Asked.of(req), fleet)
    path = c.pointer
    if not c.has_resources:
        value = {"requests": dict(wanted.quantities), "limits": dict(wanted.quantities)}
        return [{"op": "add", "path": f"{path}/resources", "value": value}]
    ops: list[Op] = []
    for part, current in (("requests", c.requests), ("limits", c.limits)):
        at = f"{path}/resources/{part}"
        if not current:
            ops.append({"op": "add", "path": at, "value": dict(wanted.quantities)})
            continue
        for key in current:
            if str(key).startswith(names.RESOURCE_PREFIX) and key not in wanted.amounts:
                ops.append({"op": "remove", "path": at + pointer(key)})
        for name, segment, amount in wanted.escaped:
            if not _same_quantity(current.get(name), amount):
                ops.append({"op": "add", "path": at + segment, "value": wanted.quantities[name]})
    return ops


def _affinity_patch(affinity: Json, req: GpuRequest) -> list[Op]:
    """`_affinity_ops` for the pod's affinity and the request's node requirements, kept per (affinity, the
    memory and models asked), which is all they read: a workload's pods, and pods of other workloads with
    the same affinity, share it. Only ever read."""
    key = (exact(affinity), req.memory_mib, req.models)
    ops = _AFFINITY_OPS.get(key)
    if ops is None:
        ops = _AFFINITY_OPS.keep(key, _affinity_ops(affinity, node_requirements(req)))
    return ops


def _affinity_ops(affinity: Json, wanted: list[dict[str, Json]]) -> list[Op]:
    """AND our expressions into every required nodeSelectorTerm; never replace or drop a user's term."""
    term: Json = {"matchExpressions": wanted}
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
