"""The fragmented share the dashboard and `gpupack top` show: free share on partly used GPUs that the
typical request (the most common allocated share) cannot use (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from app.core.model import Allocation, Gpu


def typical_milli(allocs: Iterable[Allocation]) -> int:
    """The most common per-GPU share among allocations of whole GPUs (smallest on ties); 0 when there are
    none. MIG devices are taken whole (1000 milli of the device) and never share a GPU, so they say nothing
    of the shares fragmentation is judged against."""
    counts = Counter(a.milli for a in allocs if not a.on_mig)
    if not counts:
        return 0
    top = max(counts.values())
    return min(m for m, n in counts.items() if n == top)


def fragmented_milli(gpus: Iterable[Gpu], typical: int) -> int:
    """Free share on GPUs in use that is too small for a `typical` request."""
    return sum(g.milli_free for g in gpus if g.milli_used > 0 and 0 < g.milli_free < typical)
