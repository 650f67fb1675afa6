"""Placeholder pods: how a scale-up request is put to an autoscaler, and which ones to add or withdraw (pure).

A placeholder is a pause pod in gpupack's own namespace (no tenant quota is charged) asking for whole GPUs
(`nvidia.com/gpu` by default: the resource every GPU node template of Karpenter and cluster-autoscaler
already advertises) on a node of the wanted model that gpupack's agent has not labelled yet
(`gpupack.io/enabled` absent), i.e. a node still to come. Its PriorityClass is low, so any real pod
preempts it, yet above cluster-autoscaler's expendable cutoff (-10), below which CA would not scale up for
it. The autoscaler
adds a node for it; once the node's GPUs are published the planner finds room for the pending pods there and
the placeholder is withdrawn. It never stands for anything but the current plan: each reconcile compares
the placeholders there are with the plan's requests, keyed by (model, GPUs), and deletes every extra one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from app.core import names, objects
from app.core.autoscale.plan import Request

LABEL_PLACEHOLDER = f"{names.DOMAIN}/placeholder"  # "true" on every placeholder pod (the list selector)
LABEL_MODEL = f"{names.DOMAIN}/placeholder-model"
LABEL_GPUS = f"{names.DOMAIN}/placeholder-gpus"
ANNOTATION_FOR = f"{names.DOMAIN}/placeholder-for"  # the pending pods it stands for (for people, not read)
PRIORITY_CLASS = "gpupack-placeholder"
PRIORITY_VALUE = -5  # below every default pod (0), above cluster-autoscaler's expendable cutoff (-10)
DEFAULT_RESOURCE = "nvidia.com/gpu"
NAME_PREFIX = "gpupack-placeholder-"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
HOSTNAME_LABEL = "kubernetes.io/hostname"
_FOR_MAX = 1000  # characters of the pod list kept in the annotation


@dataclass(frozen=True, slots=True)
class Placeholder:
    name: str
    model: str
    gpus: int
    node: str  # "" while pending

    @property
    def shape(self) -> tuple[str, int]:
        return self.model, self.gpus

    @property
    def coming(self) -> str:
        """The name of the capacity it stands for while that is on its way (plan.Coming.name)."""
        return self.node or self.name


@dataclass(frozen=True, slots=True)
class Changes:
    create: tuple[Request, ...]
    delete: tuple[str, ...]  # placeholder pod names


def read(pod: Mapping[str, Any]) -> Placeholder | None:
    """A placeholder pod as listed, or None for a pod that is not one (or is being deleted)."""
    meta = objects.as_object(pod.get("metadata"))
    labels = objects.string_map(meta.get("labels"))
    gpus = labels.get(LABEL_GPUS, "")
    if labels.get(LABEL_PLACEHOLDER) != "true" or not gpus.isdigit() or meta.get("deletionTimestamp"):
        return None
    node = str(objects.as_object(pod.get("spec")).get("nodeName") or "")
    return Placeholder(str(meta.get("name") or ""), labels.get(LABEL_MODEL, ""), int(gpus), node)


def reconcile(
    have: Sequence[Placeholder],
    want: Sequence[Request],
    published: Set[str] = frozenset(),
    awaited: Set[str] = frozenset(),
) -> Changes:
    """Placeholders to create and to delete so that there is exactly one per wanted (model, GPUs), beside
    the ones whose capacity the plan awaits.

    A placeholder bound to a node whose GPUs are `published` (the plan already counts them) has served its
    purpose and is always withdrawn: the plan's requests are for GPUs beyond those. Any other stands for
    capacity on its way (`coming`, named by its node or, while it waits, by itself): kept while the plan
    puts pending pods there (`awaited`). Of several of one shape, a bound one is withdrawn first: its node
    is there; a pending one still waits for its node.
    """
    wanted = Counter((r.pool.model, r.gpus) for r in want if r.gpus > 0)
    keep: Counter[tuple[str, int]] = Counter()
    delete: list[str] = []
    for p in sorted(have, key=lambda p: (p.node == "", p.name), reverse=True):
        if p.node in published:
            delete.append(p.name)
        elif p.coming in awaited:
            continue
        elif keep[p.shape] < wanted[p.shape]:
            keep[p.shape] += 1
        else:
            delete.append(p.name)
    create: list[Request] = []
    missing = wanted - keep
    for r in want:
        if missing[(r.pool.model, r.gpus)] > 0:
            missing[(r.pool.model, r.gpus)] -= 1
            create.append(r)
    return Changes(tuple(create), tuple(sorted(delete)))


def body(request: Request, namespace: str, resource: str = DEFAULT_RESOURCE) -> dict[str, Any]:
    """The placeholder pod asking for `request`: its GPUs together, on a node labelled with the model."""
    pods = ",".join(request.pods)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": NAME_PREFIX,
            "namespace": namespace,
            "labels": {
                LABEL_PLACEHOLDER: "true",
                LABEL_MODEL: request.pool.model,
                LABEL_GPUS: str(request.gpus),
                "app.kubernetes.io/name": "gpupack",
                "app.kubernetes.io/component": "placeholder",
            },
            "annotations": {
                ANNOTATION_FOR: pods if len(pods) <= _FOR_MAX else pods[:_FOR_MAX] + ",...",
                # It holds nothing: cluster-autoscaler may remove its node whenever it likes.
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
            },
        },
        "spec": {
            "priorityClassName": PRIORITY_CLASS,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "nodeSelector": {names.NODE_LABEL_GPU_MODEL: request.pool.model},
            # Only on a node gpupack does not run on yet: a node that already advertises the resource (a
            # device plugin's nvidia.com/gpu) and has gpupack's agent is counted in the plan already, and a
            # placeholder bound there would stand for no new capacity.
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": names.NODE_LABEL_ENABLED, "operator": "DoesNotExist"}
                                ]
                            }
                        ]
                    }
                },
                # One placeholder per node: each stands for one imagined node, and the plan counts every
                # node a placeholder waits for as a whole pool node. Two on one node (a 1-GPU and a 5-GPU
                # one fit an 8-GPU node) would ask for GPUs the plan already counts there.
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {LABEL_PLACEHOLDER: "true"}},
                            "topologyKey": HOSTNAME_LABEL,
                        }
                    ]
                },
            },
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "placeholder",
                    "image": PAUSE_IMAGE,
                    "resources": {
                        "requests": {resource: str(request.gpus), "cpu": "1m", "memory": "8Mi"},
                        "limits": {resource: str(request.gpus)},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "runAsNonRoot": True,
                        "runAsUser": 65535,
                        "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                }
            ],
        },
    }


def priority_class() -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": PRIORITY_CLASS},
        "value": PRIORITY_VALUE,
        "preemptionPolicy": "Never",
        "globalDefault": False,
        "description": "gpupack's autoscaler placeholders: every real pod preempts them",
    }
