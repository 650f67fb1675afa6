"""AdmissionReview (admission.k8s.io/v1) and the parts of a Pod the webhook reads, as pydantic models.

The models guard the wire: a body that does not fit them is answered 422, so the mutation code can
index into the pod without defending against every shape. Unknown fields are kept (extra="allow")
because the apiserver sends many we do not read.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails

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


class EnvVar(BaseModel):
    model_config = _OPEN
    name: str


class VolumeMount(BaseModel):
    model_config = _OPEN
    name: str
    mount_path: str


class ResourceRequirements(BaseModel):
    model_config = _OPEN
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


class Container(BaseModel):
    model_config = _OPEN
    name: str
    env: list[EnvVar] | None = None
    resources: ResourceRequirements | None = None
    volume_mounts: list[VolumeMount] | None = None


class Volume(BaseModel):
    model_config = _OPEN
    name: str


class NodeSelectorRequirement(BaseModel):
    model_config = _OPEN
    key: str
    operator: str
    values: list[str] | None = None


class NodeSelectorTerm(BaseModel):
    model_config = _OPEN
    match_expressions: list[NodeSelectorRequirement] | None = None
    match_fields: list[NodeSelectorRequirement] | None = None


class NodeSelector(BaseModel):
    model_config = _OPEN
    node_selector_terms: list[NodeSelectorTerm] | None = None


class NodeAffinity(BaseModel):
    model_config = _OPEN
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None


class Affinity(BaseModel):
    model_config = _OPEN
    node_affinity: NodeAffinity | None = None


class PodSpec(BaseModel):
    model_config = _OPEN
    containers: list[Container]
    init_containers: list[Container] | None = None
    volumes: list[Volume] | None = None
    affinity: Affinity | None = None
    scheduler_name: str | None = None


class ObjectMeta(BaseModel):
    model_config = _OPEN
    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class Pod(BaseModel):
    model_config = _OPEN
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec


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
                Pod.model_validate(self.object)
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
