"""Annotation keys that look like a GPU request gpupack does not read: near misses, ignored GPU keys (pure).

A pod whose key is misspelled (`gpu_fraction`, `GPU-Fraction`, `gpu-fractions`, `gpu-memory-limit`) is
admitted as if the key were not there and may get no GPU share at all. The webhook's matchConditions send
pods with any GPU-like key (one whose name contains "gpu", in any case) besides the keys gpupack reads, so
the webhook can tell the user, in AdmissionReview warnings (what `kubectl` prints as `Warning:`):

- a key within a small edit distance of a key gpupack reads (case, `_` for `-` and a missing prefix count as
  no distance), or a known alias of one, names the key gpupack reads;
- a pod that asks for no share but carries GPU-like keys hears that gpupack gives it none.

Warnings never change the admission decision.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Final

from app.core import names
from app.core.podview import nv_key, portion_key

# Every fixed key gpupack reads on a pod.
READ_KEYS: Final = (
    names.GPU_FRACTION,
    names.GPU_MEMORY,
    names.GPU_MEMORY_LIMIT,
    names.GPU_FRACTION_NUM_DEVICES,
    names.GPU_FRACTION_CONTAINER_NAME,
    names.GPU_MODEL,
    names.ISOLATION,
    names.MEMORY_ENFORCEMENT,
    names.MIG_PROFILE,
    names.MOVABLE,
    names.KAI_FRACTION_LIMIT,
    names.KAI_GPU_MEMORY_LIMIT,
    names.KAI_POD_COMPUTE_MODE,
)
# The fields of per-container keys gpupack reads, by prefix (the container's name comes between).
READ_FIELDS: Final = {
    names.KAI_CONTAINER_PREFIX: (names.KAI_MEMORY_REQUEST, names.KAI_MEMORY_LIMIT, names.KAI_COMPUTE_MODE),
    names.KAI_PORTION_PREFIX: (names.KAI_PORTION_LIMIT,),
}
# Fields of those prefixes that are other tools' own and no near miss: KAI's binder writes them.
OTHERS_FIELDS: Final = frozenset({"gpus.devices", "gpu-compute.portion", "gpu-compute.request"})
# Other projects' names for what a key gpupack reads says.
ALIASES: Final = {
    "nvidia.com/use-gputype": names.GPU_MODEL,  # HAMi
    "hami.io/gpu-type": names.GPU_MODEL,
}
# difflib's similarity (2 x matching characters / both lengths) above which a key is a near miss:
# 'gpu-fractions' scores 0.96 against gpu-fraction, 'gpu-fraction-container' 0.90 against
# gpu-fraction-container-name; gpu-memory against gpu-fraction only 0.64.
CUTOFF: Final = 0.85


def gpu_like(key: str) -> bool:
    """A key that looks like a GPU setting: the webhook's matchConditions send pods carrying one."""
    return "gpu" in key.lower()


def warnings(annotations: Mapping[str, str], asks: bool) -> tuple[str, ...]:
    """The admission warnings for a pod's annotations; `asks`: the pod asks gpupack for a share."""
    out = [
        f"annotation {key!r} is not read by gpupack; did you mean {' or '.join(map(repr, meant))}?"
        for key in annotations
        if not _read(key) and (meant := near(key))
    ]
    gpu_keys = [k for k in annotations if gpu_like(k) and k not in names.ALLOCATION_ANNOTATIONS]
    if not asks and gpu_keys:
        listed = ", ".join(map(repr, gpu_keys))
        out.append(
            f"gpupack gives this pod no GPU share: none of its GPU annotations ({listed}) asks for one; a "
            f"share is asked with {names.GPU_FRACTION}, {names.GPU_MEMORY} or {names.MIG_PROFILE}"
        )
    return tuple(out)


# Cached: a cluster's pods carry the same few keys over and over, and matching one costs ~0.1 ms.
@lru_cache(maxsize=4096)
def near(key: str) -> tuple[str, ...]:
    """The keys gpupack reads that `key` (a key it does not read) is a near miss or an alias of, closest
    first; empty when it is neither."""
    if (alias := ALIASES.get(key.lower())) is not None:
        return (alias,)
    per_container = _per_container(key)
    if per_container is not None:
        return per_container
    if key in names.ALLOCATION_ANNOTATIONS:
        return ()
    close = _close(_norm(key), _SPELLINGS) or _close(_norm(_name(key)), _SPELLINGS)
    return tuple(dict.fromkeys(_SPELLINGS[c] for c in close))


def _per_container(key: str) -> tuple[str, ...] | None:
    """For a key of a per-container prefix (in any case): the read keys for that container its field is a
    near miss of (maybe none); None for a key of no such prefix."""
    for prefix, fields in READ_FIELDS.items():
        if key.lower().startswith(prefix):
            container, _, field = key[len(prefix) :].partition(".")
            if field in OTHERS_FIELDS:
                return ()
            wanted = {_norm(f): f for f in fields}
            close = _close(_norm(field), wanted)
            return tuple(f"{prefix}{container}.{wanted[c]}" for c in close)
    return None


def _norm(key: str) -> str:
    """Case, '_' and ' ' for '-' are no difference at all."""
    return key.lower().replace("_", "-").replace(" ", "-")


def _name(key: str) -> str:
    """A key without its prefix (`gpupack.io/gpu-model` → `gpu-model`)."""
    return key.rpartition("/")[2]


# Each read key by its normalized spelling, with and without its prefix.
_SPELLINGS: Final = {_norm(k): k for k in READ_KEYS} | {_norm(_name(k)): k for k in READ_KEYS}


def _read(key: str) -> bool:
    return key in READ_KEYS or nv_key(key) is not None or portion_key(key) is not None


def _close(word: str, wanted: Iterable[str]) -> list[str]:
    return difflib.get_close_matches(word, wanted, n=2, cutoff=CUTOFF)
