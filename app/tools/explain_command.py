"""`gpupack explain [NAMESPACE/]POD`: per node and per GPU, why a gpupack pod went (or would go) there."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from app.core import explain, names
from app.core.errors import FieldError, KubeError
from app.core.isolation import MemoryEnforcement
from app.core.model import CUDA_CONTEXT_MIB, MILLI_PER_GPU, Demand
from app.core.objects import as_object
from app.core.placement import DEFAULT_POLICY, registry
from app.core.pods import pod_info
from app.kube import calls, snapshot
from app.kube.client import Kube, current_namespace
from app.tools.repack.command import seconds_arg
from app.tools.repack.selectors import NOT_SELECTED, scheduler_refusal

REQUIRED_AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"
# A pod name (a DNS-1123 subdomain), optionally after its namespace (a DNS-1123 label).
_POD = re.compile(
    r"(?:(?P<namespace>[a-z0-9]([-a-z0-9]*[a-z0-9])?)/)?(?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)"
)


def _pod_key(text: str) -> tuple[str | None, str]:
    """An argparse type: (namespace or None, name) from POD or NAMESPACE/POD."""
    match = _POD.fullmatch(text)
    if match is None:
        rule = "must be POD or NAMESPACE/POD (lowercase letters, digits, '-' and, in POD, '.')"
        raise argparse.ArgumentTypeError(str(FieldError("POD", text, rule)))
    return match["namespace"], match["name"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "explain",
        help="why a gpupack pod was (or would be) placed on each node and GPU",
        description="Reads the cluster and runs the extender's placement code for the pod, its own share "
        "left out: every node and GPU with the reason it fits or not, node selector, affinity and cordon "
        "included.",
    )
    p.add_argument(
        "pod",
        type=_pod_key,
        metavar="[NAMESPACE/]POD",
        help="the pod; without NAMESPACE, in the kubeconfig context's namespace (as kubectl)",
    )
    p.add_argument("--policy", choices=registry.names(), default=DEFAULT_POLICY, help="the extender's policy")
    p.add_argument("--json", action="store_true", help="the /explain document instead of a table")
    p.add_argument(
        "--heartbeat-timeout",
        type=seconds_arg("--heartbeat-timeout"),
        help="the extender's --heartbeat-timeout (seconds)",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.set_defaults(func=run)


def scheduler_exclusions(
    pod: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
    gpunodes: Iterable[str] = (),
    models: Collection[str] = (),
) -> dict[str, str]:
    """Nodes kube-scheduler removes before asking the extender: cordoned, selector/affinity mismatch, or
    no Node object at all (a GPUNode can outlive its Node; the scheduler only offers nodes that exist).

    `models`: the pod's gpupack.io/gpu-model list. The webhook turns it into a required affinity on the
    node's model label, so a node of another model is named as such, not as a generic affinity mismatch."""
    spec = as_object(pod.get("spec"))
    existing = {str(as_object(n.get("metadata")).get("name") or "") for n in nodes}
    out = {
        name: "no Node object of that name (only its GPUNode is left)"
        for name in gpunodes
        if name not in existing
    }
    for node in nodes:
        refusal = scheduler_refusal(spec, node)
        if refusal is None:
            continue
        meta = as_object(node.get("metadata"))
        model = as_object(meta.get("labels")).get(names.NODE_LABEL_GPU_MODEL)
        if (
            refusal == NOT_SELECTED
            and models
            and isinstance(model, str)
            and model not in models
            and scheduler_refusal(without_model_affinity(spec), node) is None
        ):
            wanted = "|".join(sorted(models))
            refusal = f"GPU model {model} is not one of {wanted} (the pod's {names.GPU_MODEL})"
        out[str(meta.get("name") or "")] = refusal
    return out


def without_model_affinity(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The pod spec without the node-affinity expressions on the GPU model label the webhook added: what
    the node would be judged on if the model were not asked for."""
    terms = (
        as_object(as_object(as_object(spec.get("affinity")).get("nodeAffinity")).get(REQUIRED_AFFINITY))
    ).get("nodeSelectorTerms")
    if not isinstance(terms, list):
        return dict(spec)
    kept = [
        {
            **as_object(t),
            "matchExpressions": [
                e
                for e in as_object(t).get("matchExpressions") or []
                if as_object(e).get("key") != names.NODE_LABEL_GPU_MODEL
            ],
        }
        for t in terms
    ]
    affinity = as_object(spec.get("affinity"))
    node_affinity = {
        **as_object(affinity.get("nodeAffinity")),
        REQUIRED_AFFINITY: {"nodeSelectorTerms": kept},
    }
    return {**spec, "affinity": {**affinity, "nodeAffinity": node_affinity}}


def missing_models(models: Collection[str], nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """When no node has any model the pod allows: which models the cluster's GPU nodes do have."""
    have = {
        str(m)
        for n in nodes
        if (m := as_object(as_object(n.get("metadata")).get("labels")).get(names.NODE_LABEL_GPU_MODEL))
    }
    if not models or not have or have & set(models):
        return None
    return (
        f"no node has a GPU of model {'|'.join(sorted(models))} ({names.GPU_MODEL}); "
        f"the GPU nodes' models: {', '.join(sorted(have))}"
    )


def _demand_text(d: Demand) -> str:
    if d.mig_profile:
        what = f"a MIG device {d.mig_profile}"
    elif d.mig:
        what = f"a MIG device with {d.memory_mib} MiB"
    elif d.milli is not None:
        what = f"{d.milli / MILLI_PER_GPU:.2f} of a GPU"
    else:
        what = f"{d.memory_mib} MiB"
    models = "|".join(sorted(d.models)) or "any model"
    needs = [f"{names.ISOLATION}=none"] if d.timeslice else []
    if d.memory_enforcement is not MemoryEnforcement.NONE:
        needs.append(f"memory enforcement >= {d.memory_enforcement.value}")
    return f"{d.count} x {what} ({models})" + "".join(f", {n}" for n in needs)


def render(key: str, doc: Mapping[str, Any]) -> str:
    if doc.get("demand") is None:
        return f"{key}: {doc.get('error')}"
    d = doc["demand"]
    demand = Demand(
        d["count"],
        d["milli"],
        d["memoryMiB"],
        frozenset(d["models"]),
        timeslice=d.get("timeSlice", False),
        mig=d.get("mig", False),
        mig_profile=d.get("migProfile") or "",
        memory_enforcement=MemoryEnforcement(d.get("memoryEnforcement", MemoryEnforcement.NONE)),
    )
    lines = [f"pod {key}: {_demand_text(demand)}, policy {doc['policy']}"]
    # GPUs by the name `gpupack top` gives them (a MIG device as parent/slot), not the node-wide index
    named = {
        (row["node"], str(g["gpu"])): g.get("device", str(g["gpu"]))
        for row in doc["nodes"]
        for g in row.get("gpus", ())
    }

    def devices(node: str, indexes: Iterable[object]) -> str:
        return ",".join(named.get((node, str(i)), str(i)) for i in indexes)

    alloc = doc.get("allocation")
    if doc.get("boundTo"):
        raw = (alloc or {}).get("gpupack.io/gpu-indexes", "?")
        lines.append(f"bound to {doc['boundTo']}, GPU {devices(doc['boundTo'], raw.split(','))}")
        limit = str((alloc or {}).get(names.ALLOC_MEMORY_LIMIT_MIB, ""))
        if limit.isdigit():
            usable = max(int(limit) - CUDA_CONTEXT_MIB, 0)
            lines.append(
                f"GPU memory per GPU: limit {limit} MiB; about {usable} MiB for allocations "
                f"(the CUDA context counts against the limit)"
            )
    choice = doc.get("choice")
    where = (
        f"{choice['node']}, GPU {devices(choice['node'], choice['gpus'])}"
        if choice
        else "nowhere: no node fits"
    )
    lines.append(f"placed now it would go to {where}")
    if doc.get("hint"):
        lines.append(doc["hint"])
    lines.append("")
    lines.append(f"{'NODE / GPU':<28} {'FITS':<4} {'SCORE':>7}  WHY")
    for row in doc["nodes"]:
        score = f"{row['score']:.1f}" if row.get("score") is not None else ""
        why = row.get("reason") or ""
        lines.append(f"{row['node']:<28} {'yes' if row['fits'] else 'no':<4} {score:>7}  {why}")
        for g in row.get("gpus", ()):
            free = f"{g['milliFree'] / MILLI_PER_GPU:.2f} free, {g['memoryRoomMiB']} MiB room"
            if g.get("mpsMode"):
                free += f"; MPS {g['mpsMode']}, memory enforced: {g['memoryEnforcement']}"
            name = f"gpu{g.get('device', g['gpu'])}" + (f" {g['migProfile']}" if g.get("migProfile") else "")
            lines.append(f"  {name:<26} {'yes' if g['fits'] else 'no':<4} {'':>7}  {g['reason'] or free}")
    return "\n".join(line.rstrip() for line in lines)


def missing_pod(kube: Kube, ns: str, name: str) -> str:
    """Why a pod is not among gpupack's: it does not exist, or it is not a gpupack pod."""
    try:
        kube.send(calls.get_pod(ns, name))
    except KubeError as exc:
        if exc.code == 404:
            return f"pod {ns}/{name} not found"
        raise
    return (
        f"pod {ns}/{name} is not a gpupack pod (no label {names.LABEL_MANAGED}=true): it asks for no GPU "
        "share, or was created where the gpupack webhook does not run"
    )


def run(args: argparse.Namespace) -> int:
    given_ns, name = args.pod
    try:
        kube = Kube.connect(args.kubeconfig)
        ns = given_ns or current_namespace(args.kubeconfig)
        snap = snapshot.read(kube)
    except KubeError as exc:
        print(f"gpupack explain: {exc}", file=sys.stderr)
        return 1
    key = f"{ns}/{name}"
    pod = next(
        (
            p
            for p in snap.pods
            if as_object(p.get("metadata")).get("namespace") == ns
            and as_object(p.get("metadata")).get("name") == name
        ),
        None,
    )
    if pod is None:
        try:
            why = missing_pod(kube, ns, name)
        except KubeError as exc:
            why = str(exc)
        print(f"gpupack explain: {why}", file=sys.stderr)
        return 1
    info = pod_info(pod)
    cache = snap.cache(args.heartbeat_timeout)
    nodes = cache.nodes(exclude_uid=info.uid)
    models = info.demand.models if isinstance(info.demand, Demand) else frozenset()
    excluded = scheduler_exclusions(pod, snap.nodes, nodes, models)
    doc = explain.explain(nodes, info.demand, registry.create(args.policy), excluded)
    if hint := missing_models(models, snap.nodes):
        doc["hint"] = hint
    doc["pod"] = key
    doc["boundTo"] = info.node_name or None
    doc["allocation"] = info.alloc.to_annotations() if info.alloc else None
    print(json.dumps(doc, indent=2) if args.json else render(key, doc))
    return 0
