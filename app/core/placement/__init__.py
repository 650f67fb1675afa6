"""Placement policies behind one interface, the engine that chooses with them, and `place`, its reference."""

from app.core.placement import arrayforms, binpack, fragaware, spread
from app.core.placement.base import DEFAULT_POLICY, Policy, Registry, registry
from app.core.placement.fit import FOREIGN_MARGIN_MIB, node_misfit
from app.core.placement.place import Placement, normalize_scores, place, score_nodes, to_allocation
from app.core.placement.workload import PodShape, TargetWorkload, default_workload

__all__ = [
    "DEFAULT_POLICY",
    "FOREIGN_MARGIN_MIB",
    "Placement",
    "PodShape",
    "Policy",
    "Registry",
    "TargetWorkload",
    "arrayforms",
    "binpack",
    "default_workload",
    "fragaware",
    "node_misfit",
    "normalize_scores",
    "place",
    "registry",
    "score_nodes",
    "spread",
    "to_allocation",
]
