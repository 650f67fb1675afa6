"""The quantile the benches report: nearest rank over the sorted values (no interpolation between runs)."""

from __future__ import annotations

from collections.abc import Sequence


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The value at rank round(q * (n - 1)) of `ordered` (sorted, not empty): q 0.5 the median's lower or
    upper neighbour, q 0.99 the p99."""
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
