"""The one interface every placement policy implements, and the name -> policy registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

from app.errors import PlacementReason
from app.model import Demand, Node
from app.placement.workload import TargetWorkload, default_workload


@runtime_checkable
class Policy(Protocol):
    """Decides where a demand goes. Every method is pure: same node and demand, same answer."""

    name: str

    def filter(self, node: Node, demand: Demand) -> PlacementReason | None:
        """None when the node can take the demand, else why not."""
        ...

    def score(self, node: Node, demand: Demand) -> float:
        """How good the node is for the demand; higher is better. Only called on nodes that pass filter."""
        ...

    def choose_gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
        """The GPU indexes (ascending) to use on a node that passed filter."""
        ...


PolicyFactory = Callable[[TargetWorkload], Policy]


class Registry:
    """Policy factories by name. Tests build their own or swap entries with `replaced`."""

    def __init__(self) -> None:
        self._factories: dict[str, PolicyFactory] = {}

    def register(self, name: str) -> Callable[[PolicyFactory], PolicyFactory]:
        def add(factory: PolicyFactory) -> PolicyFactory:
            self._factories[name] = factory
            return factory

        return add

    def names(self) -> tuple[str, ...]:
        return tuple(self._factories)

    def create(self, name: str, workload: TargetWorkload | None = None) -> Policy:
        """A fresh policy; `workload` is the target pod distribution (built-in default when None)."""
        factory = self._factories.get(name)
        if factory is None:
            raise KeyError(f"unknown placement policy {name!r}; known: {', '.join(self.names())}")
        return factory(workload if workload is not None else default_workload())

    @contextmanager
    def replaced(self, factories: dict[str, PolicyFactory]) -> Iterator[Registry]:
        """Temporarily use exactly `factories` (for tests)."""
        saved = self._factories
        self._factories = dict(factories)
        try:
            yield self
        finally:
            self._factories = saved


registry = Registry()
DEFAULT_POLICY = "fragaware"
