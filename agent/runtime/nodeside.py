"""What one container of a pod gets from the node before its first process runs (pure).

The RuntimeClass handler (handler/, `gpupack-runc`) asks the agent on `create` of every container of a
pod that runs under gpupack's RuntimeClass: "pod <uid> <namespace>/<name>, container <name>, id <id>".
The agent reads the pod from the apiserver and answers here:

- the GPU container: its allocation as env (the same values the kubelet resolves from the allocation
  annotations, set again at the node so a spec edited after admission cannot change them) and, for an
  MPS share, `CUDA_MPS_PIPE_DIRECTORY` plus a bind mount of the pod's own MPS directory there;
- the GPU container loses NVIDIA's own per-cgroup memory-limit variables (`NVIDIA_GPU_MEMORY_*`, read by
  the NVIDIA toolkit's `apply-cuda-memory-limits` hook): gpupack alone sets the share's limits, so the
  hook never applies a second, tenant-chosen limit or reservation on top (docs/node-side.md);
- every other container: `NVIDIA_VISIBLE_DEVICES=void` (no GPU), nothing else;
- the GPU container's per-cgroup GPU memory limits (agent.enforce.memlimits: hard = the pod's limit,
  soft = its share), which the node sets when the container's cgroup exists and before its first process:
  the answer asks the handler for its createRuntime hook, whose `start` message (`parse_message`) names the
  container's pid and cgroup; `delete` (the container's `runc delete`) clears them again;
- a refusal with the reason wherever the answer cannot be right: the pod is gone or on another node, it
  is no gpupack pod, its allocation cannot be read, its request is invalid, or (an MPS share) the MPS
  daemon pod has not prepared the node since it booted (its ready record, agent.mpsdaemon.mpsprep). The
  handler then fails the container's `create` with that reason (the pod shows CreateContainerError) rather
  than start it without its share's state: the node side fails closed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.enforce import memlimits
from agent.enforce.memlimits import Limits
from app.core import allocenv, names, request
from app.core.pods import allocation_of, is_gpupack
from app.core.podview import PodView
from app.core.request import GpuRequest, Isolation

# NVIDIA's memory-limit hook reads these (singular in the merged toolkit change, plural as KAI injects them;
# which spellings a given toolkit reads is UNVERIFIED, so both go).
NVIDIA_MEMORY_LIMIT_ENV = (
    "NVIDIA_GPU_MEMORY_REQUEST",
    "NVIDIA_GPU_MEMORY_LIMIT",
    "NVIDIA_GPU_MEMORY_REQUESTS",
    "NVIDIA_GPU_MEMORY_LIMITS",
)
ASK_FIELDS = ("pod_uid", "namespace", "name", "container", "container_id")
# The createRuntime hook's message adds where the new container instance runs.
START_FIELDS = ("pid", "cgroups_path", "cgroup", "cgroup_root")
# A stop (`runc kill`, `runc delete --force`) adds the host pids of the container's processes.
STOP_FIELDS = ("pids",)


@dataclass(frozen=True, slots=True)
class Ask:
    """One question of the handler: which container of which pod is about to be created."""

    pod_uid: str
    namespace: str
    name: str
    container: str
    container_id: str

    @property
    def where(self) -> str:
        return f"pod {self.namespace}/{self.name} (uid {self.pod_uid})"


@dataclass(frozen=True, slots=True)
class Start:
    """The createRuntime hook of one container instance: its cgroup exists, its first process has not run.

    `cgroups_path` is the OCI spec's `linux.cgroupsPath`; `cgroup` the `0::` entry of the container's
    /proc/<pid>/cgroup as the hook read it on the host; `cgroup_root` where the hook found cgroup v2 mounted
    ("" on a cgroup v1-only node)."""

    ask: Ask
    pid: int
    cgroups_path: str
    cgroup: str
    cgroup_root: str


@dataclass(frozen=True, slots=True)
class Stopping:
    """`runc kill` or `runc delete --force` of a running container, before any signal: its MPS clients are
    to be ended through the daemon first (agent.mpsdaemon.drain). `pids`: its processes, as host pids."""

    ask: Ask
    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Ended:
    """`runc delete` of a container: whatever the node set up for it goes."""

    container_id: str


@dataclass(frozen=True, slots=True)
class Mount:
    source: str  # a host path
    destination: str  # the path in the container
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class Answer:
    allowed: bool
    reason: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    unset: tuple[str, ...] = ()  # env the container must not have
    hook: bool = False  # the handler adds its createRuntime hook (limits to set once the cgroup exists)

    def to_json(self) -> dict[str, Any]:
        # `hook` only when asked for: a handler older than the hook (a node-side rollout behind the agent's)
        # then still reads every other answer; one that must hook fails closed on the unknown field.
        return ({"hook": True} if self.hook else {}) | {
            "allowed": self.allowed,
            "reason": self.reason,
            "env": dict(self.env),
            "unset": list(self.unset),
            "mounts": [
                {"source": m.source, "destination": m.destination, "read_only": m.read_only}
                for m in self.mounts
            ],
        }


@dataclass(frozen=True, slots=True)
class Grant:
    """What the container gets before the pod's MPS directory is known (`mps`: it needs one)."""

    env: Mapping[str, str]
    mps: bool = False
    unset: tuple[str, ...] = ()
    limits: Limits | None = None  # the GPU container's per-cgroup memory limits on each of `gpu_uuids`
    gpu_uuids: tuple[str, ...] = ()
    thread_percentage: int = 100


def refuse(reason: str) -> Answer:
    return Answer(False, reason)


def parse_ask(raw: object) -> Ask | str:
    """The handler's JSON line for a `create`, or what is wrong with it (every field named)."""
    parsed = parse_message(raw)
    if isinstance(parsed, (Start, Stopping, Ended)):
        return "malformed request: a create carries no op"
    return parsed


def parse_message(raw: object) -> Ask | Start | Stopping | Ended | str:
    """One line of the handler: a create (no `op`), the hook's `start`, a `stop` or a `delete`; or what is
    wrong with it (every field named)."""
    if not isinstance(raw, Mapping):
        return f"the request must be a JSON object, not {type(raw).__name__}"
    op = raw.get("op", "create")
    if op not in ("create", "start", "stop", "delete"):
        return f"malformed request: op {op!r} must be create, start, stop or delete"
    need = {
        "create": ASK_FIELDS,
        "start": ASK_FIELDS + START_FIELDS,
        "stop": ASK_FIELDS + STOP_FIELDS,
        "delete": ("container_id",),
    }[op]
    problems = []
    for k in need:
        v = raw.get(k)
        if k == "pids":
            if not isinstance(v, list) or not all(type(p) is int and p > 0 for p in v):
                problems.append(f"pids must be a list of positive integers (got {v!r})")
        elif k == "pid":
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                problems.append(f"pid must be a positive integer (got {v!r})")
        elif k in ("cgroup", "cgroup_root"):  # "" is a fact here (no cgroup v2), not a missing field
            if not isinstance(v, str):
                problems.append(f"{k} must be a string (got {v!r})")
        elif not isinstance(v, str) or not v:
            problems.append(f"{k} must be a non-empty string (got {v!r})")
    problems += [f"unknown field {k!r}" for k in sorted(set(raw) - set(need) - {"op"})]
    if problems:
        return "malformed request: " + "; ".join(problems)
    if op == "delete":
        return Ended(str(raw["container_id"]))
    ask = Ask(*(str(raw[k]) for k in ASK_FIELDS))
    if op == "create":
        return ask
    if op == "stop":
        return Stopping(ask, tuple(raw["pids"]))
    return Start(ask, int(raw["pid"]), str(raw["cgroups_path"]), str(raw["cgroup"]), str(raw["cgroup_root"]))


def cgroup_namespace(start: Start, root: str) -> str:
    """The container's cgroup v2 directory (what NVML keys its limits by), checked against what the hook
    saw: the leaf named by `linux.cgroupsPath` must be the one its process is in. A refusal starts with
    "refused: "."""
    leaf = memlimits.leaf(start.cgroups_path)
    if leaf is None:
        return f"refused: linux.cgroupsPath {start.cgroups_path!r} names no cgroup this node can place"
    if not start.cgroup_root:
        return (
            "refused: the node has no cgroup v2 hierarchy (cgroup v1 only): per-cgroup memory is unavailable"
        )
    if start.cgroup_root != root:
        return f"refused: the hook found cgroup v2 at {start.cgroup_root}, the agent at {root}"
    if start.cgroup != leaf:
        return (
            f"refused: the container's process {start.pid} is in cgroup {start.cgroup!r}, not in the leaf "
            f"{leaf!r} its linux.cgroupsPath {start.cgroups_path!r} names"
        )
    return root.rstrip("/") + leaf


def always_ready(uuids: Sequence[str]) -> str:
    """A readiness check that never refuses (a node without the MPS daemon pod's ready record to check)."""
    return ""


def decide(
    ask: Ask, pod: PodView | None, node: str, mps_not_ready: Callable[[Sequence[str]], str] = always_ready
) -> Grant | Answer:
    """The grant for `ask` given the pod as the apiserver has it (None: not found), or a refusal.

    `mps_not_ready(uuids)`: why an MPS client on those GPUs must not start now ("" when it may), from the
    MPS daemon pod's ready record (agent.mpsdaemon.mpsprep.not_ready): missing, or written before this boot,
    the daemon pod has not prepared the GPUs' compute modes, and the container is refused with that reason.
    """
    if pod is None or pod.uid != ask.pod_uid:
        return refuse(f"{ask.where} is not in the apiserver (deleted, or recreated under the same name)")
    if pod.node_name != node:
        return refuse(f"{ask.where} is bound to node {pod.node_name!r}, not to this node {node!r}")
    if not is_gpupack(pod):
        return refuse(
            f"{ask.where} is no gpupack pod (no {names.DOMAIN}/* request): gpupack's RuntimeClass serves "
            "only pods the gpupack webhook admitted; remove spec.runtimeClassName"
        )
    if ask.container != (pod.gpu_container or ""):
        return Grant({names.ENV_NVIDIA_VISIBLE_DEVICES: names.NO_GPU})
    allocation, allocation_error = allocation_of(pod)
    if allocation is None:
        why = allocation_error or "it has no allocation annotations (it was never placed by gpupack)"
        return refuse(f"the allocation of {ask.where} cannot be read: {why}")
    if allocation.node != node:
        return refuse(f"{ask.where} holds an allocation on node {allocation.node!r}, not {node!r}")
    parsed = request.parse(pod)
    if not isinstance(parsed, GpuRequest):
        return refuse(f"the GPU request of {ask.where} is invalid: " + "; ".join(map(str, parsed)))
    alloc = allocation.to_annotations()
    mps = parsed.isolation is Isolation.MPS
    if mps and (why := mps_not_ready(allocation.gpu_uuids)):
        return refuse(f"container {ask.container!r} of {ask.where} would be an MPS client too early: {why}")
    table = allocenv.gpu_env(burstable=parsed.burstable, mps=mps)
    env = {v.name: alloc.get(v.annotation, "") if v.annotation else v.value for v in table}
    return Grant(
        env,
        mps=mps,
        unset=NVIDIA_MEMORY_LIMIT_ENV,
        # MIG devices carry no per-cgroup limits (NVIDIA: memory partitioning does not support MIG).
        limits=None if parsed.isolation is Isolation.MIG else memlimits.limits_of(parsed, allocation),
        gpu_uuids=allocation.gpu_uuids,
        thread_percentage=allocation.thread_percentage,
    )


def answer(grant: Grant, mps_dir: str | None, hook: bool = False, extra: Sequence[Mount] = ()) -> Answer:
    """The handler's answer: the grant, with the pod's MPS directory mounted where its env points, the
    createRuntime hook where limits are to be set, and `extra` mounts for the GPU container."""
    mounts: tuple[Mount, ...] = (Mount(mps_dir, names.MPS_PIPE_DIRECTORY),) if grant.mps and mps_dir else ()
    if grant.limits is not None:
        mounts += tuple(extra)
    return Answer(
        True, env=grant.env, mounts=mounts, unset=grant.unset, hook=hook and grant.limits is not None
    )
