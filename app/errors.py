"""Error values a user or operator can see: each names the field, the value and the rule it broke."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class RequestError:
    """A pod annotation (or other user input) that breaks one rule."""

    field: str  # annotation key, e.g. "gpu-fraction"
    value: str  # exactly as the user wrote it
    rule: str  # "must be a decimal in (0, 1] with at most 2 decimals"

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.rule}"


@dataclass(frozen=True, slots=True)
class SettingError:
    """A service setting (set by one command-line flag) that breaks one rule."""

    field: str  # the settings field, e.g. "ops_port"
    flag: str  # the flag that sets it, e.g. "--ops-port"
    value: str  # as given; strings quoted, so an empty one shows as ''
    rule: str  # "must be in 1..65535"

    def __str__(self) -> str:
        return f"{self.field}={self.value}: {self.rule}"

    def as_flag(self) -> str:
        """The error as the user typed it: "--ops-port=0: must be in 1..65535"."""
        return f"{self.flag}={self.value}: {self.rule}"


class ReasonKind(StrEnum):
    """What kind of refusal a placement reason is, so no reader has to parse its sentence."""

    CAPACITY = "capacity"  # not enough free share, GPU memory, CPU or host memory: departures could help
    MODEL = "model"  # no GPU of an acceptable model
    NODE = "node"  # the node's state: agent silent, no (healthy) GPUs, no MPS, GPUs not selectable


@dataclass(frozen=True, slots=True)
class PlacementReason:
    """Why a node (or one GPU on it) cannot take a request."""

    node: str
    gpu: int | None  # GPU index, or None when the reason is about the whole node
    rule: str
    kind: ReasonKind = ReasonKind.NODE

    def __str__(self) -> str:
        where = self.node if self.gpu is None else f"{self.node}/gpu{self.gpu}"
        return f"{where}: {self.rule}"


class KubeError(Exception):
    """A failed Kubernetes API call, reduced to the API's own Status fields."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message

    @property
    def is_conflict(self) -> bool:
        return self.code == 409

    @property
    def is_gone(self) -> bool:
        return self.code == 410

    @property
    def is_not_found(self) -> bool:
        return self.code == 404
