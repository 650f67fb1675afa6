"""KAI-Scheduler's NvFractions annotations, read as one GPU-share request (pure).

KAI names a pod's GPU memory per container, `nvidia.com/container.<c>.gpu-memory.request|limit` (Kubernetes
quantities; with only one of the two, the other equals it), and its compute mode either per container
(`nvidia.com/container.<c>.gpu-compute.mode`, the gpu-sharing operator's spelling) or per pod
(`kai.scheduler/gpu-compute-sharing-mode`, KAI's docs): `time-slicing` (the default) or `sm-sharing`.
Both spellings are accepted; they must agree when both are written.

`read` finds which container the annotations name and which of them is the request, the limit and the mode,
with every rule that needs only the annotations; `app.core.request` turns the values into gpupack's request
(request = `gpu-memory`, limit = `gpupack.io/gpu-memory-limit`) and checks them against the pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from app.core import names
from app.core.errors import RequestError
from app.core.podview import nv_key

Entry = tuple[str, str]  # (annotation key, value)


class ComputeMode(StrEnum):
    """KAI's compute modes. In KAI both run as MPS clients; sm-sharing on a server whose clients share one
    context, so their kernels run at once (it needs MPS); time-slicing in contexts of their own."""

    TIME_SLICING = "time-slicing"
    SM_SHARING = "sm-sharing"


@dataclass(frozen=True, slots=True)
class NvAsk:
    """What a pod's NvFractions annotations ask for, as written, with what is wrong with them alone."""

    container: str | None = None  # the container every per-container key names (the first one's)
    request: Entry | None = None
    limit: Entry | None = None
    mode: Entry | None = None  # the compute mode, per container or per pod
    errors: tuple[RequestError, ...] = ()

    @property
    def memory(self) -> Entry | None:
        """The entry that is the pod's memory request: the request, else the limit (KAI: "if only limit is
        present, KAI defaults the request to the same value")."""
        return self.request or self.limit

    def entries(self) -> tuple[Entry, ...]:
        return tuple(e for e in (self.request, self.limit) if e is not None)


def read(entries: Sequence[Entry]) -> NvAsk:
    """The NvFractions ask among (key, value) entries (those `podview.GpuAsk.nv_fractions` holds)."""
    if not entries:  # most pods: no KAI keys (one shared answer, as each pod read asks)
        return _NONE
    fields: dict[str, Entry] = {}
    pod_mode: Entry | None = None
    container: tuple[str, str] | None = None  # (name, the key that named it first)
    errors: list[RequestError] = []
    for key, value in entries:
        split = nv_key(key)
        if split is None:
            pod_mode = (key, value) if key == names.KAI_POD_COMPUTE_MODE else pod_mode
            continue
        name, field = split
        if container is None:
            container = (name, key)
        elif name != container[0]:
            errors.append(
                RequestError(
                    key,
                    value,
                    f"names container {name!r}, but {container[1]} names {container[0]!r}: only one "
                    "container of a pod gets a GPU share",
                )
            )
            continue
        fields[field] = (key, value)
    mode = fields.get(names.KAI_COMPUTE_MODE)
    for key, value in (e for e in (mode, pod_mode) if e is not None):
        if value not in {m.value for m in ComputeMode}:
            errors.append(RequestError(key, value, "must be 'time-slicing' or 'sm-sharing'"))
    if mode and pod_mode and mode[1] != pod_mode[1]:
        rule = f"disagrees with {pod_mode[0]}={pod_mode[1]!r} (KAI's two spellings of the mode): set one"
        errors.append(RequestError(mode[0], mode[1], rule))
    return NvAsk(
        container=container[0] if container else None,
        request=fields.get(names.KAI_MEMORY_REQUEST),
        limit=fields.get(names.KAI_MEMORY_LIMIT),
        mode=mode or pod_mode,
        errors=tuple(errors),
    )


_NONE = NvAsk()
