"""The GPU model catalogue (app/data/gpu_models.json): model names, NVML aliases and memory sizes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    memory_mib: int
    aliases: tuple[str, ...]


@cache
def models() -> dict[str, GpuModel]:
    raw = json.loads(resources.files("app.data").joinpath("gpu_models.json").read_text())
    out: dict[str, GpuModel] = {}
    for name, spec in raw["models"].items():
        mem = spec.get("memory_mib")
        if not isinstance(mem, int) or mem <= 0:
            raise ValueError(f"gpu_models.json: models.{name}.memory_mib={mem!r}: must be a positive integer")
        out[name] = GpuModel(name=name, memory_mib=mem, aliases=tuple(spec.get("aliases", ())))
    return out


def lookup(name: str) -> GpuModel:
    """A model by its gpupack name or an NVML product-name alias; KeyError lists the known names."""
    table = models()
    if name in table:
        return table[name]
    for model in table.values():
        if name in model.aliases:
            return model
    raise KeyError(f"unknown GPU model {name!r}; known: {', '.join(sorted(table))}")
