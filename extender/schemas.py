"""kube-scheduler extender wire format (k8s.io/kube-scheduler/extender/v1): Go field names as JSON keys."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

JsonObject = dict[str, Any]


class _Wire(BaseModel):
    # The scheduler may add fields in later versions; ignoring them keeps old extenders working.
    model_config = ConfigDict(extra="ignore")


class NodeList(_Wire):
    items: list[JsonObject] = Field(default_factory=list)


class ExtenderArgs(_Wire):
    """filter and prioritize request. With nodeCacheCapable only NodeNames is set."""

    Pod: JsonObject
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None

    def node_names(self) -> list[str]:
        """Candidate names from whichever field the scheduler filled."""
        if self.NodeNames is not None:
            return list(self.NodeNames)
        if self.Nodes is not None:
            return [str((n.get("metadata") or {}).get("name", "")) for n in self.Nodes.items]
        return []


class ExtenderFilterResult(_Wire):
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(_Wire):
    Host: str
    Score: int


class HostPriorityList(RootModel[list[HostPriority]]):
    pass


class ExtenderBindingArgs(_Wire):
    PodName: str
    PodNamespace: str
    PodUID: str = ""
    Node: str


class ExtenderBindingResult(_Wire):
    Error: str = ""
