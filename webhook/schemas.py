"""AdmissionReview (admission.k8s.io/v1) as pydantic models, and the shape of the parts of a Pod the
webhook reads.

They guard the wire: a body that does not fit them is answered 422, so the mutation code can index into
the pod without defending against every shape. Unknown fields of the review are kept (extra="allow")
because the apiserver sends many we do not read; the pod is checked, then read as it was sent.
"""

from __future__ import annotations

from typing import Any, Final, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails
from typing_extensions import TypedDict  # pydantic reads a TypedDict only from here on Python 3.11

# Python names are snake_case; the wire names (aliases) are the API's camelCase.
_OPEN = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)

Quantity = str | int | float  # the apiserver sends strings; hand-written tests sometimes numbers


class GroupVersionKind(BaseModel):
    model_config = _OPEN
    group: str = ""
    version: str
    kind: str


class GroupVersionResource(BaseModel):
    model_config = _OPEN
    group: str = ""
    version: str
    resource: str


# The parts of a Pod the mutation reads, checked for their shape only (the review keeps the object as sent).
# TypedDicts, not models: pydantic checks them without building an object per container, env entry and
# affinity term (a fifth of the CPU), and fields it does not read are skipped rather than copied. The errors
# are located and worded as a model's would be (a value that is no object: "Input should be an object").
_SHAPE = ConfigDict(extra="ignore", alias_generator=to_camel, populate_by_name=True)


class EnvVar(TypedDict):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    name: str


class VolumeMount(TypedDict):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    name: str
    mount_path: str


class ResourceRequirements(TypedDict, total=False):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    requests: dict[str, Quantity] | None
    limits: dict[str, Quantity] | None


class Container(TypedDict):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    name: str
    env: NotRequired[list[EnvVar] | None]
    resources: NotRequired[ResourceRequirements | None]
    volume_mounts: NotRequired[list[VolumeMount] | None]


class Volume(TypedDict):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    name: str


class NodeSelectorRequirement(TypedDict):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    key: str
    operator: str
    values: NotRequired[list[str] | None]


class NodeSelectorTerm(TypedDict, total=False):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    match_expressions: list[NodeSelectorRequirement] | None
    match_fields: list[NodeSelectorRequirement] | None


class NodeSelector(TypedDict, total=False):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    node_selector_terms: list[NodeSelectorTerm] | None


class NodeAffinity(TypedDict, total=False):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    required_during_scheduling_ignored_during_execution: NodeSelector | None


class Affinity(TypedDict, total=False):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    node_affinity: NodeAffinity | None


class PodSpec(TypedDict):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    containers: list[Container]
    init_containers: NotRequired[list[Container] | None]
    volumes: NotRequired[list[Volume] | None]
    affinity: NotRequired[Affinity | None]
    scheduler_name: NotRequired[str | None]


class ObjectMeta(TypedDict, total=False):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    name: str | None
    generate_name: str | None
    namespace: str | None
    labels: dict[str, str] | None
    annotations: dict[str, str] | None


class Pod(TypedDict):
    __pydantic_config__ = _SHAPE  # type: ignore[misc]
    metadata: NotRequired[ObjectMeta]
    spec: PodSpec


_POD_SHAPE: Final = TypeAdapter(Pod)


class AdmissionRequest(BaseModel):
    model_config = _OPEN
    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    resource: GroupVersionResource
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    namespace: str = ""
    name: str = ""
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = None
    dry_run: bool | None = None

    @model_validator(mode="after")
    def _pod_shape(self) -> AdmissionRequest:
        # Only a core/v1 Pod object is read by the mutation, so only its shape is checked.
        if self.object is not None and self.kind.group == "" and self.kind.kind == "Pod":
            try:
                _POD_SHAPE.validate_python(self.object)
            except ValidationError as exc:
                # Raised as is, the pod's errors would be located relative to the request (`request.spec…`);
                # the field the user sent is `request.object.spec…`.
                raise ValidationError.from_exception_data(
                    exc.title,
                    [
                        InitErrorDetails(
                            type=e["type"], loc=("object", *e["loc"]), input=e["input"], ctx=e.get("ctx", {})
                        )
                        for e in exc.errors(include_url=False)
                    ],
                ) from None
        return self


class AdmissionReview(BaseModel):
    model_config = _OPEN
    api_version: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest
