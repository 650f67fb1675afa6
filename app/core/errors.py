"""Error values a user or operator can see: each names the field, the value and the rule it broke."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class FieldError:
    """One rule broken by one field of input a user or operator gave: a file, a flag, an object, a pod.

    The one shape of such errors: where (`field`), what was there (`value`, as given), and the rule it
    broke; printed as `field=value: rule` with the value in Python's notation, so '' and ' 1' show.
    """

    field: str  # where, as the user would find it: "gpu-fraction", "--seeds", "gpus[2].memory_mib"
    value: object  # exactly as given (None: absent)
    rule: str  # "must be a decimal in (0, 1] with at most 2 decimals"

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.rule}"


@dataclass(frozen=True, slots=True)
class RequestError(FieldError):
    """A pod annotation (or other part of a pod) that breaks one rule; its value is the annotation's text."""


class InputError(ValueError):
    """Input that breaks rules, with every FieldError in the order found; `source` says whose fields."""

    def __init__(self, errors: Sequence[FieldError], source: str = "") -> None:
        self.errors = tuple(errors)
        self.source = source
        text = "; ".join(map(str, self.errors))
        super().__init__(f"{source}: {text}" if source else text)


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


class Shortfall(StrEnum):
    """The rule a node breaks for a demand, in the order placement checks them."""

    UNSCHEDULABLE = "unschedulable"  # detail: the node's own reason (stale agent, cordoned for us)
    CPU = "cpu"  # needed / free CPU milli
    HOST_MEMORY = "host_memory"  # needed / free host memory MiB
    NO_MPS = "no_mps"  # the pod asks for isolation=mps; detail: why the node has none
    NO_GPUS = "no_gpus"
    NO_HEALTHY_GPU = "no_healthy_gpu"
    MODEL = "model"  # detail: the node's model; models: the acceptable ones
    ALL_MIG = (
        "all_mig"  # a whole-GPU or share demand on a node whose every GPU is partitioned into MIG devices
    )
    # A MIG demand no free MIG device fits: needed = MiB (0 for a profile), profile = the one asked for,
    # free / detail = memory and profile of the largest free MIG device, count, passing, mig_devices
    MIG_DEVICE = "mig_device"
    # The GPUs' sharing mode or memory enforcement does not suit the pod (app.core.isolation); detail: what
    # the pod asks and what the GPUs give; count, passing
    ISOLATION = "isolation"
    GPU_SHARE = "gpu_share"  # needed / free milli per GPU (free: the best GPU's), count, passing
    GPU_MEMORY = "gpu_memory"  # needed / free MiB per GPU (free: the best GPU's), count, passing, foreign

    @property
    def kind(self) -> ReasonKind:
        if self in (
            Shortfall.CPU,
            Shortfall.HOST_MEMORY,
            Shortfall.GPU_SHARE,
            Shortfall.GPU_MEMORY,
            Shortfall.MIG_DEVICE,
        ):
            return ReasonKind.CAPACITY
        return ReasonKind.MODEL if self is Shortfall.MODEL else ReasonKind.NODE


@dataclass(frozen=True, slots=True)
class ForeignUse:
    """The GPU where processes outside gpupack pods take the most memory, for a memory refusal."""

    gpu: int
    total_mib: int
    reserved_mib: int  # by gpupack pods
    foreign_mib: int
    margin_mib: int


@dataclass(frozen=True, slots=True)
class PlacementReason:
    """Why a node (or one GPU on it) cannot take a request: a typed value; `rule` is its text."""

    node: str
    gpu: int | None  # GPU index, or None when the reason is about the whole node
    shortfall: Shortfall
    needed: int = 0  # what the demand needs (per GPU for GPU rules), in the rule's unit
    free: int = 0  # what the node (its best GPU, for GPU rules) has free, same unit
    count: int = 1  # GPUs the demand needs
    passing: int = 0  # GPUs that pass the rule (multi-GPU demands)
    detail: str = ""  # the node's own words (unschedulable, no MPS) or its GPU model
    models: tuple[str, ...] = ()  # acceptable models (MODEL)
    foreign: ForeignUse | None = None  # memory used outside gpupack pods (GPU_MEMORY)
    profile: str = ""  # the MIG profile asked for (MIG_DEVICE)
    mig_devices: int = 0  # MIG devices on the node (MIG_DEVICE)
    asked: str = ""  # what the pod wrote, as key=value (NO_MPS: the annotation that asks for MPS)

    @property
    def kind(self) -> ReasonKind:
        return self.shortfall.kind

    @property
    def rule(self) -> str:
        return render_reason(self)

    def __str__(self) -> str:
        where = self.node if self.gpu is None else f"{self.node}/gpu{self.gpu}"
        return f"{where}: {self.rule}"


def share(milli: int) -> str:
    """Milli as a GPU share for messages: 500 -> "0.50", 805 -> "0.805"."""
    return f"{milli / 1000:.2f}" if milli % 10 == 0 else f"{milli / 1000:.3f}"  # 1000 milli = one GPU


def render_reason(r: PlacementReason) -> str:
    """The sentence kube-scheduler, /explain and logs show for a refusal."""
    match r.shortfall:
        case Shortfall.UNSCHEDULABLE:
            return r.detail or "node is not schedulable"
        case Shortfall.CPU:
            return f"needs {r.needed} CPU milli: {r.free} free"
        case Shortfall.HOST_MEMORY:
            return f"needs {r.needed} MiB host memory: {r.free} MiB free"
        case Shortfall.NO_MPS:
            # KAI's sm-sharing asks for MPS without saying so: name both
            asked = r.asked if not r.asked or r.asked.endswith("=mps") else f"{r.asked} (MPS)"
            return (
                f"pod asks for {asked or 'isolation=mps'}, but {r.detail or 'no MPS daemon serves this node'}"
            )
        case Shortfall.NO_GPUS:
            return "node has no GPUs"
        case Shortfall.NO_HEALTHY_GPU:
            return "no healthy GPU"
        case Shortfall.MODEL:
            return f"GPU model {r.detail} is not one of {'|'.join(r.models)}"
        case Shortfall.ALL_MIG:
            return (
                "every GPU is partitioned into MIG devices, which are taken whole: ask with "
                "gpupack.io/mig-profile, or gpu-memory with gpupack.io/isolation: mig"
            )
        case Shortfall.MIG_DEVICE:
            return render_mig(r)
        case Shortfall.ISOLATION:
            verb = "suits" if r.passing == 1 else "suit"
            gpus = f" (it needs {r.count} GPUs; {r.passing} {verb} it)" if r.count > 1 else ""
            return f"{r.detail}{gpus}"
    fmt = share if r.shortfall is Shortfall.GPU_SHARE else (lambda v: f"{v} MiB")
    if r.count == 1:
        text = f"no GPU with {fmt(r.needed)} free: best has {fmt(max(r.free, 0))}"
    else:
        text = f"needs {r.count} GPUs with {fmt(r.needed)} free: {r.passing} have it"
    f = r.foreign
    if f is not None:
        text += (
            f" (gpu{f.gpu}: {f.total_mib} MiB total, {f.reserved_mib} MiB reserved by gpupack pods,"
            f" {f.foreign_mib} MiB used by processes outside gpupack pods, {f.margin_mib} MiB margin)"
        )
    return text


def render_mig(r: PlacementReason) -> str:
    """A MIG refusal, naming the largest free MIG device (what the pod could have had)."""
    want = f"of profile {r.profile}" if r.profile else f"with {r.needed} MiB"
    if not r.mig_devices:
        return f"no MIG device {want}: node has no MIG devices"
    if r.count == 1:
        text = f"no free MIG device {want}"
    else:
        text = f"needs {r.count} free MIG devices {want}: {r.passing} free"
    if not r.detail:
        return f"{text}: all {r.mig_devices} MIG devices are in use"
    return f"{text}: the largest free is {r.detail} ({r.free} MiB)"


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
