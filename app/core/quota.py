"""Namespace GPU quota: what each GPU request is charged, and how a namespace stands against its quota (pure).

Every gpupack pod carries, beside the resource placement reads (`gpupack.io/gpu-milli` or
`gpupack.io/gpu-memory-mib`), two quota-only extended resources that the webhook computes from the request:

- `gpupack.io/quota-gpu-milli`: the GPU share the pod may take. A fraction is exact; a memory request is
  charged the share it would take on the smallest GPU that could hold it (never more than a whole GPU).
- `gpupack.io/quota-gpu-memory-mib`: the GPU memory the pod may take. A memory request is exact; a fraction
  is charged its share of the largest GPU it could land on.

"Could land on" is the GPUs the cluster has (a `Fleet`: each model the webhook sees in the GPUNode objects,
with its memory) that `gpupack.io/gpu-model` allows. Where it knows none of those (no GPUNode read yet, or
none of an allowed model), it is the models `gpupack.io/gpu-model` allows when the catalogue knows them all,
else every model of the catalogue; a fraction naming no catalogue model is then charged its share of the
fleet's fallback memory (the chart's `webhook.quotaGpuMemoryMiB`) when one is set.

No node advertises the two resources: kube-scheduler is told to ignore them (`ignoredByScheduler` in the
extender entry of its configuration) and the kubelet skips extended resources its node does not advertise,
so the over-estimate binds a namespace's quota and never a node.

A quota on the placement resources themselves would count one request kind only (memory pods carry no
`gpupack.io/gpu-milli`); the chart's `quota-resources` ValidatingAdmissionPolicy refuses one and names these
two instead (deploy/helm/gpupack/templates/admission-policies.yaml).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from app.core import catalog, names, units
from app.core.model import MILLI_PER_GPU
from app.core.objects import as_object
from app.core.request import GpuRequest

QUOTA_PREFIX: Final = "requests."  # ResourceQuota counts extended resources by their requests only


@dataclass(frozen=True, slots=True)
class Charge:
    """What one pod counts against its namespace's quota (all devices together)."""

    milli: int
    memory_mib: int

    def resources(self) -> dict[str, int]:
        """The quota-only extended resources the webhook writes on the GPU container."""
        return {
            names.RESOURCE_QUOTA_GPU_MILLI: self.milli,
            names.RESOURCE_QUOTA_GPU_MEMORY_MIB: self.memory_mib,
        }


@dataclass(frozen=True, slots=True)
class Fleet:
    """The GPUs a pod could land on, as far as the webhook knows them.

    `models`: each GPU model of the cluster's GPUNode objects and the memory of its largest GPU (MiB); empty
    when none was read. `fallback_memory_mib`: the memory a fraction is charged a share of when no GPU of an
    allowed model is known (the chart's `webhook.quotaGpuMemoryMiB`); None: the largest catalogue model.
    """

    models: Mapping[str, int] = field(default_factory=dict)
    fallback_memory_mib: int | None = None

    def __hash__(self) -> int:  # `models` is a mapping; a fleet is hashed by its content, as it compares
        return hash((tuple(self.models.items()), self.fallback_memory_mib))

    def allowed(self, models: tuple[str, ...]) -> dict[str, int]:
        """The fleet's models a request naming `models` (none: any) may land on."""
        return {m: mib for m, mib in self.models.items() if not models or m in models}


UNKNOWN_FLEET: Final = Fleet()


def charge(req: GpuRequest, fleet: Fleet = UNKNOWN_FLEET) -> Charge:
    """The conservative quota charge of a valid request: per device, times the number of devices.

    The GPUs it may land on are the fleet's allowed models when there are any, else the catalogue's (see the
    module docstring). A whole MIG device of a profile is charged its compute slices' share of the parent
    GPU (rounded up to whole milli: 1g is 143 of 1000) and the most memory that profile has on a model it may
    land on; a memory request with MIG isolation is charged as any memory request. A kind not known here is
    charged the most a device can take (a whole GPU of the largest model it may get).
    """
    in_fleet = fleet.allowed(req.models)
    candidates = _candidates(tuple(in_fleet) if in_fleet else req.models)
    if in_fleet:
        sizes = tuple(in_fleet.values())
        largest = max(sizes)
    else:
        sizes = tuple(g.memory_mib for g in candidates)
        named = req.models and candidates  # catalogue models the pod names: their memory is known exactly
        largest = (
            max(sizes)
            if named
            else fleet.fallback_memory_mib or max(g.memory_mib for g in catalog.models().values())
        )
    if req.milli is not None:
        per_device = Charge(req.milli, req.milli * largest // MILLI_PER_GPU)
    elif req.memory_mib is not None:
        fitting = [mib for mib in sizes if mib >= req.memory_mib]
        smallest = min(fitting, default=0)
        milli = (
            min(MILLI_PER_GPU, -(-req.memory_mib * MILLI_PER_GPU // smallest)) if smallest else MILLI_PER_GPU
        )
        per_device = Charge(milli, req.memory_mib)
    elif req.mig_profile:
        per_device = _mig_charge(req.mig_profile, candidates, largest)
    else:
        # A kind not charged above: the most one device can take, a whole GPU of the largest model.
        per_device = Charge(MILLI_PER_GPU, largest)
    return Charge(per_device.milli * req.count, per_device.memory_mib * req.count)


def _mig_charge(profile: str, candidates: tuple[catalog.GpuModel, ...], largest: int) -> Charge:
    """A whole MIG device: its compute slices' share of a GPU, and its largest memory on a candidate model."""
    sizes = [p.memory_mib for g in candidates if (p := g.mig_profile(profile)) is not None]
    slices = catalog.compute_slices(profile)
    milli = min(MILLI_PER_GPU, -(-slices * MILLI_PER_GPU // catalog.MIG_COMPUTE_SLICES))
    return Charge(milli, max(sizes, default=largest))


def _candidates(models: Iterable[str]) -> tuple[catalog.GpuModel, ...]:
    """The catalogue models a request may land on; () when it allows a model the catalogue does not know."""
    table = catalog.models()
    listed = tuple(models)
    if not listed:
        return tuple(table.values())
    if all(m in table for m in listed):
        return tuple(table[m] for m in listed)
    return ()


# --- a namespace against its quota (what `gpupack top` shows) ---


@dataclass(frozen=True, slots=True)
class QuotaUse:
    """One gpupack resource of one ResourceQuota: used and hard, in the resource's own unit."""

    namespace: str
    quota: str
    resource: str  # the quota's key, e.g. requests.gpupack.io/quota-gpu-milli
    used: Fraction
    hard: Fraction

    @property
    def ratio(self) -> float:
        return float(self.used / self.hard) if self.hard else (1.0 if self.used else 0.0)


def uses(quotas: Iterable[Mapping[str, Any]]) -> list[QuotaUse]:
    """Every gpupack resource limited by these ResourceQuota objects, by namespace, quota and resource.

    `status` is what the quota controller computed (its `hard` is the spec it enforces); a quota it has
    not seen yet reads from `spec.hard` with nothing used.
    """
    out = []
    for q in quotas:
        meta, spec, status = (as_object(q.get(k)) for k in ("metadata", "spec", "status"))
        hard = as_object(status.get("hard")) or as_object(spec.get("hard"))
        used = as_object(status.get("used"))
        for key, raw in hard.items():
            if not str(key).removeprefix(QUOTA_PREFIX).startswith(names.RESOURCE_PREFIX):
                continue
            limit = units.quantity_value(str(raw))
            if limit is None:
                continue
            now = units.quantity_value(str(used.get(key, "0"))) or Fraction(0)
            out.append(
                QuotaUse(str(meta.get("namespace", "")), str(meta.get("name", "")), str(key), now, limit)
            )
    return sorted(out, key=lambda u: (u.namespace, u.quota, u.resource))
