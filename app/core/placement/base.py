"""The one interface every placement policy implements, and the registry of policies and their array forms."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

from app.core.errors import PlacementReason
from app.core.model import Demand, Node
from app.core.placement.workload import TargetWorkload, default_workload


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


@runtime_checkable
class Evaluates(Protocol):
    """A policy that finds its score and its GPUs in one evaluation (the engine keeps both per state)."""

    def evaluate(self, node: Node, demand: Demand) -> tuple[float, tuple[int, ...]]:
        """(score(node, demand), choose_gpus(node, demand)) for a node that passed filter."""
        ...


Judged = PlacementReason | float  # an array form's answer for one node: the refusal, or the score


class ArrayForm(Protocol):
    """A policy's own filter and score, on many nodes in one array pass, answer for answer the same."""

    def covers(self, demand: Demand) -> bool:
        """Whether `judge` answers for this demand (else every answer would be None)."""
        ...

    def read(self, node: Node) -> Any:
        """What the pass reads of one node state (kept per state by the engine)."""
        ...

    def prepare(self, reads: Sequence[Any]) -> None:
        """Work out now what no demand changes of these nodes (`read`s in the order a pass over every
        node will hand them), for the next pass to find ready."""
        ...

    def judge(self, nodes: Sequence[Node], reads: Sequence[Any], demand: Demand) -> list[Judged | None]:
        """Per node (with `read(node)` beside it): the policy's refusal, else its score; None where the
        pass leaves the node to the policy itself."""
        ...


PolicyFactory = Callable[[TargetWorkload], Policy]
ArrayFactory = Callable[[Any], ArrayForm]


class Registry:
    """Policy factories by name. Tests build their own or swap entries with `replaced`."""

    def __init__(self) -> None:
        self._factories: dict[str, PolicyFactory] = {}
        self._arrays: dict[type, ArrayFactory] = {}

    def register(self, name: str) -> Callable[[PolicyFactory], PolicyFactory]:
        def add(factory: PolicyFactory) -> PolicyFactory:
            self._factories[name] = factory
            return factory

        return add

    def register_array(self, policy_type: type) -> Callable[[ArrayFactory], ArrayFactory]:
        """Declare the array form of `policy_type`'s scoring (for that exact type: a subclass may score
        otherwise, and is judged one node at a time)."""

        def add(factory: ArrayFactory) -> ArrayFactory:
            self._arrays[policy_type] = factory
            return factory

        return add

    def array_form(self, policy: Policy) -> ArrayForm | None:
        """The array form declared for this policy's type, bound to it; None: judged node by node."""
        factory = self._arrays.get(type(policy))
        return None if factory is None else factory(policy)

    def names(self) -> tuple[str, ...]:
        """In name order, whatever order the modules registered in (the CLI's and the benches' order)."""
        return tuple(sorted(self._factories))

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
