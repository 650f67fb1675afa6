"""Which compute processes on shared GPUs must be ended, and which pods evicted for it (pure).

Each agent cycle the loop hands over what it read: NVML's per-GPU process lists (agent.nvml.sample), each
pid's pod (its cgroup, agent.enforce.cgroup) and command name, the node's gpupack pods and their allocation
check (agent.enforce.verify), and the MPS daemon's servers and clients. `decide` names every process that is
not where its allocation says, with the rule it breaks; the loop ends them (agent.enforce.ending) and tells
their pods.

What counts as where its allocation says, on a GPU gpupack shares (not MIG-enabled):
- a process of a gpupack pod whose allocation names the GPU, in the pod's GPU container, with the pod's
  processes on that GPU within its memory cap (NVML's per-process figures, summed);
- on a GPU MPS serves, that process is also an MPS client (the daemon lists it under a server), unless the
  pod asked for `isolation: none`. A process the daemon does not list has a context of its own on the whole
  GPU, with no limits: measured, a client whose pipe directory has no live daemon runs that way, silently.
Never touched: the MPS daemon and its servers (by command name, and the daemon's own server list), GPUs
gpupack does not share, pods in exempt namespaces or with the exempt label, and processes the simulated
GPU set merely lists (no such process exists to end).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agent.enforce.cgroup import PodRef
from agent.enforce.verify import Kind, Verdict
from agent.nvml.sample import NodeSample
from app.core import podview
from app.core.model import Demand
from app.core.pods import PodInfo
from app.kube import paths
from app.kube.calls import Request

# /proc/<pid>/comm is cut at 15 characters: nvidia-cuda-mps-control and nvidia-cuda-mps-server both read so.
MPS_COMM = "nvidia-cuda-mps"


class Rule(StrEnum):
    """Why a process is ended (also the `rule` label of gpupack_agent_watchdog_ended_total)."""

    NO_POD = "no_pod"  # a host process, outside any pod
    OTHER_POD = "other_pod"  # a process of a pod gpupack did not place (no gpupack allocation at all)
    NO_ALLOCATION = "no_allocation"  # a gpupack pod without a (valid) allocation
    NOT_ALLOCATED = "not_allocated"  # a gpupack pod's process on a GPU its allocation does not name
    WRONG_CONTAINER = "wrong_container"  # a container of the pod other than its GPU container
    OVER_MEMORY = "over_memory"  # the pod's processes on the GPU use more than its cap
    NOT_MPS_CLIENT = "not_mps_client"  # a plain context on a GPU MPS serves: no MPS limits apply


REASON = "GpupackProcessEnded"  # the Event reason on the pod
EVICTED_REASON = "GpupackEvictedByWatchdog"

_FROM_VERIFY: Mapping[Kind, Rule] = {
    Kind.NO_ALLOCATION: Rule.NO_ALLOCATION,
    Kind.WRONG_GPU: Rule.NOT_ALLOCATED,
    Kind.WRONG_CONTAINER: Rule.WRONG_CONTAINER,
    Kind.OVER_MEMORY: Rule.OVER_MEMORY,
}


@dataclass(frozen=True, slots=True)
class PodMeta:
    """A pod of this node as the exemptions see it (any pod, gpupack's or not)."""

    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Policy:
    """What the operator set: pods never touched, and after how many endings a pod is evicted (0: never)."""

    exempt_namespaces: frozenset[str] = frozenset()
    exempt_label: tuple[str, str] | None = None  # (key, value)
    evict_after: int = 3

    def exempt(self, meta: PodMeta) -> bool:
        if meta.namespace in self.exempt_namespaces:
            return True
        key_value = self.exempt_label
        return key_value is not None and meta.labels.get(key_value[0]) == key_value[1]


@dataclass(frozen=True, slots=True)
class Facts:
    """What the loop knows this cycle besides the sample.

    `shared_gpus`: UUIDs of the GPUs gpupack shares (the others are never looked at); `mps_gpus`: those
    MPS serves; `mps_servers`/`mps_clients`: pids the daemon lists (`mps_clients` None: unknown this cycle,
    so no process is judged for not being a client); `comms`: pid → command name ("" when unknown);
    `fictional`: pids the simulated GPU set lists (no process to end).
    """

    shared_gpus: frozenset[str]
    mps_gpus: frozenset[str] = frozenset()
    mps_servers: frozenset[int] = frozenset()
    mps_clients: frozenset[int] | None = None
    comms: Mapping[int, str] | None = None
    fictional: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class Ending:
    """One process to end: where it runs, the rule it breaks, and its pod (None: in no pod)."""

    pid: int
    gpu_uuid: str
    gpu_index: int
    rule: Rule
    pod: PodMeta | None
    used_mib: int | None
    limit_mib: int | None = None  # the pod's cap on the GPU (OVER_MEMORY)
    mps_client: bool = False  # listed by the daemon: end it through the daemon before the signal


@dataclass(frozen=True, slots=True)
class Decision:
    endings: tuple[Ending, ...]
    unknown_pods: frozenset[str]  # pod UIDs whose namespace/labels are needed before judging their processes


def decide(
    sample: NodeSample,
    refs: Mapping[int, PodRef | None],
    pods: Mapping[str, PodInfo],
    *,
    verdict: Verdict,
    metas: Mapping[str, PodMeta],
    facts: Facts,
    policy: Policy,
) -> Decision:
    """Every process on a shared GPU to end this cycle, in GPU then pid order."""
    broken: dict[tuple[int, str], Kind] = {}
    for v in verdict.violations:
        if v.kind in _FROM_VERIFY and v.kind is not Kind.OVER_MEMORY:
            for pid in v.pids:
                broken.setdefault((pid, v.gpu_uuid), v.kind)
    over = _over_memory(sample, verdict, refs)
    comms = facts.comms or {}
    clients = facts.mps_clients
    endings: list[Ending] = []
    unknown: set[str] = set()
    for gpu in sample.gpus:
        if gpu.uuid not in facts.shared_gpus or gpu.mig_enabled:
            continue
        for p in sorted(gpu.processes, key=lambda p: p.pid):
            if p.pid in facts.fictional or p.pid in facts.mps_servers or comms.get(p.pid, "") == MPS_COMM:
                continue
            ref = refs.get(p.pid)
            pod = pods.get(ref.pod_uid) if ref is not None else None
            meta: PodMeta | None = None
            if ref is not None:
                meta = metas.get(ref.pod_uid)
                if meta is None and pod is not None and policy.exempt_label is None:
                    meta = PodMeta(pod.uid, pod.namespace, pod.name, {})
                if meta is None:
                    unknown.add(ref.pod_uid)  # its namespace and labels decide whether it is exempt
                    continue
                if policy.exempt(meta):
                    continue
            listed = clients is not None and p.pid in clients
            rule = _rule(
                p.pid, gpu.uuid, ref=ref, pod=pod, broken=broken, over=over, facts=facts, listed=listed
            )
            if rule is not None:
                limit = over.get(p.pid) if rule is Rule.OVER_MEMORY else None
                endings.append(Ending(p.pid, gpu.uuid, gpu.index, rule, meta, p.used_mib, limit, listed))
    return Decision(tuple(endings), frozenset(unknown))


def _rule(
    pid: int,
    gpu_uuid: str,
    *,
    ref: PodRef | None,
    pod: PodInfo | None,
    broken: Mapping[tuple[int, str], Kind],
    over: Mapping[int, int],
    facts: Facts,
    listed: bool,
) -> Rule | None:
    """The rule one (non-exempt) process breaks on a shared GPU, or None where it is where it should be."""
    if ref is None:
        return Rule.NO_POD
    if pod is None:
        return Rule.OTHER_POD
    kind = broken.get((pid, gpu_uuid))
    if kind is not None:
        return _FROM_VERIFY[kind]
    if pid in over:
        return Rule.OVER_MEMORY
    if gpu_uuid in facts.mps_gpus and facts.mps_clients is not None and not listed and _wants_mps(pod):
        return Rule.NOT_MPS_CLIENT
    return None


def _over_memory(sample: NodeSample, verdict: Verdict, refs: Mapping[int, PodRef | None]) -> dict[int, int]:
    """pid → the cap it is ended for: per pod over its cap on a GPU, its largest processes, until the rest
    fit (one process over the cap alone is always among them)."""
    used = {(p.pid, g.uuid): p.used_mib or 0 for g in sample.gpus for p in g.processes}
    out: dict[int, int] = {}
    for v in verdict.violations:
        if v.kind is not Kind.OVER_MEMORY or v.pod.allocation is None:
            continue
        cap = v.pod.allocation.cap_mib
        mine = sorted(v.pids, key=lambda pid: (-used.get((pid, v.gpu_uuid), 0), pid))
        total = sum(used.get((pid, v.gpu_uuid), 0) for pid in mine)
        for pid in mine:
            if total <= cap:
                break
            out[pid] = cap
            total -= used.get((pid, v.gpu_uuid), 0)
    return out


def _wants_mps(pod: PodInfo) -> bool:
    """The pod's share is served by MPS: a valid request, not `isolation: none` (nor a MIG device)."""
    demand = pod.demand
    return isinstance(demand, Demand) and not demand.timeslice and not demand.mig


def strikes(before: Mapping[str, int], endings: Collection[Ending]) -> dict[str, int]:
    """Endings per pod UID so far, this cycle's added (each ended process counts once)."""
    out: defaultdict[str, int] = defaultdict(int, before)
    for e in endings:
        if e.pod is not None:
            out[e.pod.uid] += 1
    return dict(out)


def to_evict(before: Mapping[str, int], after: Mapping[str, int], policy: Policy) -> tuple[str, ...]:
    """Pod UIDs that reached `policy.evict_after` endings this cycle (each is evicted once)."""
    n = policy.evict_after
    if n <= 0:
        return ()
    return tuple(sorted(uid for uid, count in after.items() if count >= n > before.get(uid, 0)))


def message(e: Ending, outcome: str) -> str:
    """The Event text on the pod: the process, the GPU, the rule, and what was done."""
    where = f"GPU {e.gpu_index} ({e.gpu_uuid})"
    mib = "" if e.used_mib is None else f", {e.used_mib} MiB"
    return f"process {e.pid} on {where}{mib}: {describe(e)}; {outcome}"


def describe(e: Ending) -> str:
    """The rule an ending breaks, in words."""
    match e.rule:
        case Rule.NO_POD:
            return "it runs in no pod (a host process) on a GPU gpupack shares"
        case Rule.OTHER_POD:
            return "its pod was not placed by gpupack and has no share of this GPU"
        case Rule.NO_ALLOCATION:
            return "its pod has no valid gpupack allocation"
        case Rule.NOT_ALLOCATED:
            return "its pod's allocation does not name this GPU"
        case Rule.WRONG_CONTAINER:
            return "it runs in a container other than the pod's GPU container"
        case Rule.OVER_MEMORY:
            return f"its pod's processes on this GPU use more than the pod's {e.limit_mib} MiB limit"
        case Rule.NOT_MPS_CLIENT:
            return (
                "it is no MPS client (the MPS daemon lists it under no server), so it runs with the whole "
                "GPU and no limits"
            )


def list_node_pods(node: str) -> Request:
    """Every pod of this node, gpupack's or not (for the exemptions; from the apiserver's watch cache)."""
    query: dict[str, str | int | bool] = {"fieldSelector": f"spec.nodeName={node}", "resourceVersion": "0"}
    return Request("GET", paths.pods(), query=query)


def metas(items: Iterable[Mapping[str, Any]]) -> dict[str, PodMeta]:
    """pod UID → PodMeta from a pod list's items."""
    views = (podview.read(item) for item in items)
    return {v.uid: PodMeta(v.uid, v.namespace, v.name, dict(v.labels)) for v in views if v.uid}
