"""kube-scheduler extender wire format (k8s.io/kube-scheduler/extender/v1): Go field names as JSON keys."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    RootModel,
    model_validator,
)

JsonObject = dict[str, Any]
# The apiserver sends quantities as strings; hand-written callers sometimes send numbers.
Quantity = str | int | float


class _Wire(BaseModel):
    # The scheduler may add fields in later versions; ignoring them keeps old extenders working.
    model_config = ConfigDict(extra="ignore")


# --- the parts of a Pod the extender reads (app.core.request.pod_demand): their types are checked here, so a
# malformed pod is answered 422 naming the field instead of failing deep in the handler ---


class _PodPart(BaseModel):
    model_config = ConfigDict(extra="allow")  # the rest of the pod is not read, whatever it holds


class PodMeta(_PodPart):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None


class PodResources(_PodPart):
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


class PodContainer(_PodPart):
    name: str = ""
    resources: PodResources | None = None


class PodSpec(_PodPart):
    containers: list[PodContainer] | None = None
    init_containers: list[PodContainer] | None = Field(default=None, alias="initContainers")
    node_name: str | None = Field(default=None, alias="nodeName")


class PodShape(_PodPart):
    metadata: PodMeta | None = None
    spec: PodSpec | None = None


class NodeMeta(_PodPart):
    name: str = ""


class NodeItem(_PodPart):
    metadata: NodeMeta | None = None


class NodeList(_Wire):
    items: list[NodeItem] | None = None


class ExtenderArgs(_Wire):
    """filter and prioritize request. With nodeCacheCapable only NodeNames is set.

    `Pod` is type-checked as `PodShape`; the handlers read the pod as the scheduler sent it (`pod()`).
    """

    Pod: PodShape
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    _raw_pod: JsonObject | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_raw_pod(cls, data: Any, handler: ModelWrapValidatorHandler[ExtenderArgs]) -> ExtenderArgs:
        out = handler(data)
        if isinstance(data, dict) and isinstance(data.get("Pod"), dict):
            out._raw_pod = data["Pod"]
        return out

    @classmethod
    def of_pod_and_names(cls, pod: JsonObject, names: list[str] | None) -> ExtenderArgs:
        """The request of a body decoded to its pod and its node names, without a node list: the pod is
        checked against `PodShape` as `model_validate` checks it (a ValidationError where it fails)."""
        args = cls.model_construct(Pod=PodShape.model_validate(pod), Nodes=None, NodeNames=names)
        args._raw_pod = pod
        return args

    def pod(self) -> JsonObject:
        """The pod as sent (validated against `PodShape`)."""
        if self._raw_pod is not None:
            return self._raw_pod
        return self.Pod.model_dump(by_alias=True, exclude_unset=True)

    def node_names(self) -> list[str]:
        """Candidate names from whichever field the scheduler filled (NodeNames: the request's own list,
        not a copy; the verbs only read it)."""
        if self.NodeNames is not None:
            return self.NodeNames
        if self.Nodes is not None:
            return [n.metadata.name if n.metadata else "" for n in self.Nodes.items or ()]
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
    PodName: str = Field(min_length=1)
    PodNamespace: str = Field(min_length=1)
    PodUID: str = ""
    Node: str = Field(min_length=1)


class ExtenderBindingResult(_Wire):
    Error: str = ""
