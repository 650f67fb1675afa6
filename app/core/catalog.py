"""The GPU model catalogue (app/core/data/gpu_models.json): names, NVML aliases, memory sizes, MIG
profiles."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

MIG_COMPUTE_SLICES = 7  # compute slices of a MIG-capable GPU (A100, H100): a 7g profile is the whole GPU
_MIG_PROFILE = re.compile(r"([1-7])g\.([1-9][0-9]*)gb")


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG device profile of a model, e.g. 1g.10gb: compute slices, and the memory NVML reports."""

    name: str
    memory_mib: int

    @property
    def compute_slices(self) -> int:
        return compute_slices(self.name)


def compute_slices(profile: str) -> int:
    """The compute slices a MIG profile name states: 3 for "3g.40gb"."""
    return int(profile.split("g.", 1)[0])


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    memory_mib: int
    aliases: tuple[str, ...]
    mig_profiles: tuple[MigProfile, ...] = ()  # smallest memory first; empty: the model has no MIG

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


@cache
def models() -> dict[str, GpuModel]:
    raw = json.loads(resources.files("app.core.data").joinpath("gpu_models.json").read_text())
    out: dict[str, GpuModel] = {}
    for name, spec in raw["models"].items():
        mem = spec.get("memory_mib")
        if not isinstance(mem, int) or mem <= 0:
            raise ValueError(f"gpu_models.json: models.{name}.memory_mib={mem!r}: must be a positive integer")
        out[name] = GpuModel(
            name=name,
            memory_mib=mem,
            aliases=tuple(spec.get("aliases", ())),
            mig_profiles=_profiles(name, spec),
        )
    return out


def _profiles(model: str, spec: dict[str, object]) -> tuple[MigProfile, ...]:
    raw = spec.get("mig_profiles", {})
    if not isinstance(raw, dict):
        raise ValueError(f"gpu_models.json: models.{model}.mig_profiles: must be a mapping")
    out: list[MigProfile] = []
    for name, mem in raw.items():
        if not _MIG_PROFILE.fullmatch(name) or not isinstance(mem, int) or mem <= 0:
            raise ValueError(
                f"gpu_models.json: models.{model}.mig_profiles.{name}={mem!r}: must be a profile "
                "'<N>g.<M>gb' with a positive memory in MiB"
            )
        out.append(MigProfile(name, mem))
    return tuple(sorted(out, key=lambda p: (p.memory_mib, p.compute_slices, p.name)))


def mig_layout_error(model: GpuModel, profiles: tuple[str, ...]) -> str:
    """Why `profiles` cannot partition one GPU of `model` ("" when they can)."""
    if not model.mig_profiles:
        return f"model {model.name} has no MIG support"
    known = {p.name: p for p in model.mig_profiles}
    unknown = [p for p in profiles if p not in known]
    if unknown:
        return f"{unknown[0]!r} must be a MIG profile of {model.name} ({', '.join(known)})"
    used = sum(known[p].compute_slices for p in profiles)
    if not profiles or used > MIG_COMPUTE_SLICES:
        return f"must name 1 to {MIG_COMPUTE_SLICES} compute slices of MIG devices: names {used}"
    return ""


@cache  # the catalogue is fixed; request parsing asks for every pod
def mig_profile_names() -> tuple[str, ...]:
    """Every MIG profile some catalogue model offers, sorted by memory then name."""
    every = {p.name for m in models().values() for p in m.mig_profiles}
    return tuple(sorted(every, key=lambda n: (mig_profile_memory(n), n)))


@cache
def mig_profile_memory(profile: str) -> int:
    """The least memory a device of `profile` has on any model (what a pod asking for it is sure to get)."""
    sizes = [p.memory_mib for m in models().values() for p in m.mig_profiles if p.name == profile]
    if not sizes:
        raise KeyError(f"unknown MIG profile {profile!r}; known: {', '.join(mig_profile_names())}")
    return min(sizes)


def lookup(name: str) -> GpuModel:
    """A model by its gpupack name or an NVML product-name alias; KeyError lists the known names."""
    table = models()
    if name in table:
        return table[name]
    for model in table.values():
        if name in model.aliases:
            return model
    raise KeyError(f"unknown GPU model {name!r}; known: {', '.join(sorted(table))}")
