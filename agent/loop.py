"""One agent cycle: read NVML, adopt MPS, attribute and verify processes, publish, update metrics."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

from agent import metrics as m
from agent.enforce import envcheck, verify
from agent.enforce import watchdog as wd
from agent.enforce.cgroup import PodRef
from agent.enforce.ending import Ended, nothing_listens
from agent.mpsdaemon import mpsprep
from agent.mpsdaemon.mps import Device, MpsState, MpsSupervisor
from agent.nvml.base import ComputeMode, Nvml, NvmlCode, NvmlError
from agent.nvml.sample import NodeSample, Sampler
from agent.report import isolation as iso
from agent.report import reporter as rep
from app.core import log
from app.core.errors import KubeError
from app.core.model import Demand
from app.core.pods import PodInfo, pod_info
from app.kube import calls
from app.kube.calls import Request
from app.kube.gpunode import GPUNodeSpec, GPUNodeStatus

DAEMON_LOST = "GPUMPSDaemonLost"
_log = log.get("gpupack.agent")


class Resolver(Protocol):
    def pod_of(self, pid: int) -> PodRef | None: ...


class Procs(Protocol):
    """The host's processes (agent.enforce.cgroup.ProcResolver), for the container-start env check."""

    def pids(self) -> list[int]: ...
    def pod_of(self, pid: int) -> PodRef | None: ...
    def environ(self, pid: int) -> bytes | None: ...


class Hands(Protocol):
    """What the watchdog does on the host (agent.enforce.ending.HostProcesses)."""

    def comm(self, pid: int) -> str: ...
    def end(self, pid: int, ref: PodRef | None, mps_client: bool) -> Ended: ...


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str
    reporter: rep.ReporterConfig
    evict_on_violation: bool = False
    env_device_selection: str = "unknown"
    # The compute mode of the node's MPS GPUs (EXCLUSIVE_PROCESS: no process bypasses MPS); None: leave
    # modes as they are. The MPS daemon pod's init container sets it before the daemon starts
    # (agent.mpsdaemon.mpsprep); the agent switches a GPU that was busy then, once it is idle.
    mps_compute_mode: ComputeMode | None = None
    mps_time_slice_gpus: tuple[int, ...] = ()  # GPU indexes kept in DEFAULT (time-slicing beside MPS)
    # What holds for every GPU's isolation (agent.report.isolation).
    isolation: iso.NodeFacts = iso.NO_NODE_FACTS
    watchdog: wd.Policy | None = None  # None: processes out of place are reported, not ended


class Agent:
    """Call `step()` every sampling interval; dependencies are injected so tests pin the clock."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        nvml: Nvml,
        resolver: Resolver,
        mps: MpsSupervisor,
        send: Callable[[Request], dict[str, Any]],
        clock: Callable[[], float],
        procs: Procs | None = None,
        hands: Hands | None = None,
        fictional: Callable[[], Collection[int]] = frozenset,
    ) -> None:
        """`procs`: the host's processes, for the container-start env check (None: no check); `hands`: the
        watchdog's (None: it ends nothing); `fictional`: pids the simulated GPU set lists."""
        self.config = config
        self.nvml = nvml
        self.resolver = resolver
        self.mps = mps
        self.send = send
        self.clock = clock
        self.sampler = Sampler(nvml, on_error=lambda code: m.NVML_ERRORS.labels(code.value).inc())
        self.reporter = rep.Reporter(config.node, send, config.reporter, on_write=self._count_write)
        self.nvml_ready = False
        self._nvml_error = ""
        self._init_at = float("-inf")
        self._spec: GPUNodeSpec | None = None
        self._pods: dict[str, PodInfo] = {}
        self._pods_at = float("-inf")
        self._pods_read = False  # listed at least once (a failed listing leaves the last one)
        self._daemon_loss_untold: set[str] = set()  # shared GPUs of a daemon lost, its pods not yet told
        self._refs: dict[int, PodRef | None] = {}
        self._reported: set[tuple[str, verify.Kind, str]] = set()
        self._series: dict[Any, set[tuple[str, ...]]] = {}
        self.last_step: float | None = None
        self.procs = procs
        self._env_done: set[int] = set()  # pids checked, or known to be no gpupack container's
        self._env_waiting: dict[int, float] = {}  # pid -> when first seen with its container not yet listed
        self._env_relist = False
        self._modes_at = float("-inf")
        self.hands = hands
        self.fictional = fictional
        self._metas: dict[str, wd.PodMeta] = {}
        self._metas_at = float("-inf")
        self._strikes: dict[str, int] = {}

    @staticmethod
    def _count_write(kind: str, result: str) -> None:
        if kind in {w.value for w in m.AgentWrite}:  # only the pre-created series
            m.WRITES.labels(kind, result).inc()

    def _ensure_nvml(self, now: float) -> None:
        # NVML may come up after the agent (driver install); retry init once per heartbeat.
        if self.nvml_ready or now - self._init_at < self.config.reporter.heartbeat_s:
            return
        self._init_at = now
        try:
            self.nvml.init()
        except NvmlError as exc:
            m.NVML_ERRORS.labels(exc.code.value).inc()
            if str(exc) != self._nvml_error:
                _log.error("NVML init failed", extra={"code": exc.code.value, "error": str(exc)})
            self._nvml_error = str(exc)
            return
        self.nvml_ready, self._nvml_error = True, ""
        _log.info("NVML initialised", extra={"gpus": self.nvml.device_count()})

    def step(self) -> GPUNodeStatus:
        now = self.clock()
        self._ensure_nvml(now)
        self._keep_compute_modes(now)  # first, so this cycle's status reports a GPU switched just now
        sample = self.sampler.sample() if self.nvml_ready else NodeSample(error=self._nvml_error)
        if sample.error and any(
            c in sample.error for c in (NvmlCode.UNINITIALIZED, NvmlCode.DRIVER_NOT_LOADED)
        ):
            self.nvml_ready = False  # e.g. driver reloaded under us: init again at the next heartbeat
        spec = rep.build_spec(self.config.node, sample, self.mps.available(), self._spec)
        self._spec = spec
        mps = self.mps.tick([Device(g.uuid, g.memory_mib) for g in spec.shared_gpus], now)
        if self.mps.lost:
            # Told from the node's pods as they are now: one placed since the last listing (read once a
            # heartbeat) lost its clients too. Until a listing succeeds, each cycle lists again.
            self._daemon_loss_untold = {g.uuid for g in spec.shared_gpus}
        refs = self._resolve(sample)
        listed = self._refresh_pods(sample, now, at_once=bool(self._daemon_loss_untold))
        if self._daemon_loss_untold and listed:
            self._tell_daemon_lost(self._daemon_loss_untold, now)
            self._daemon_loss_untold = set()
        self._check_env(now)
        verdict = verify.verify(sample, refs, self._pods)
        self._handle_violations(verdict, now)
        self._enforce(sample, spec, refs, verdict, now)
        status = rep.build_status(
            spec=spec,
            sample=sample,
            owners=verdict.owners,
            gpupack_pods=frozenset(self._pods),
            mps=mps,
            allocated=rep.allocated_mib(self._pods),
            now=now,
            config=self.config.reporter,
            env_device_selection=self.config.env_device_selection,
            node_facts=self.config.isolation,
            mps_server=self.mps.server_running,
            mps_defaults_current=self.mps.stale_server is None,
        )
        self.reporter.tick(spec, status, now)
        self._handle_violations(verify.Verdict({}, (), verify.unhealthy(status.gpus, self._pods), ()), now)
        self._update_metrics(sample, verdict)
        self.last_step = now
        return status

    def _keep_compute_modes(self, now: float) -> None:
        """Once a heartbeat: MPS GPUs back in their compute mode where they are idle (e.g. one that was
        busy when the daemon pod started), and the ready record updated if this boot has one."""
        want = self.config.mps_compute_mode
        if want is None or not self.nvml_ready or not self.mps.available():
            return
        if now - self._modes_at < self.config.reporter.heartbeat_s:
            return
        if not self._pods_read:
            return  # the node's pods not read yet: which GPUs hold `isolation: none` shares is not known
        self._modes_at = now
        # A GPU holding an `isolation: none` share stays in DEFAULT even while idle between its processes:
        # in EXCLUSIVE_PROCESS, with the server running, that pod's next process would be refused.
        keep = set(self.config.mps_time_slice_gpus) | {
            i
            for p in self._pods.values()
            if p.allocation and isinstance(p.demand, Demand) and p.demand.timeslice
            for i in p.allocation.gpu_indexes
        }
        modes = mpsprep.apply(self.nvml, want, keep)
        for gpu in modes:
            if gpu.switched:
                _log.info("compute mode set", extra={"gpu": gpu.uuid, "mode": gpu.mode})
        pipe = self.mps.config.pipe_dir
        boot = mpsprep.boot_id()
        if any(m.switched for m in modes) and not mpsprep.not_ready(pipe, [], want, boot):
            mpsprep.write_ready(pipe, modes, boot)

    def _resolve(self, sample: NodeSample) -> dict[int, PodRef | None]:
        # A pid's cgroup never changes, so each pid is read once while it lives.
        pids = {p.pid for g in sample.gpus for p in g.processes}
        self._refs = {
            pid: self._refs[pid] if pid in self._refs else self.resolver.pod_of(pid) for pid in pids
        }
        return self._refs

    def _refresh_pods(self, sample: NodeSample, now: float, *, at_once: bool = False) -> bool:
        """Read the node's pods when due (`at_once`: whatever the cadence); True when this call read them."""
        cfg = self.config.reporter
        unknown = any(
            ref is not None and ref.pod_uid not in self._pods for ref in self._refs.values()
        )  # a process of a pod we have not seen yet: a new container started
        due = (
            at_once
            or now - self._pods_at >= cfg.heartbeat_s
            or ((unknown or self._env_relist) and now - self._pods_at >= cfg.min_interval_s)
        )
        if not due:
            return False
        self._pods_at = now
        try:
            out = self.send(verify.list_pods(self.config.node))
        except KubeError as exc:
            _log.warning("listing pods failed", extra={"code": exc.code, "error": exc.message})
            return False
        self._pods = {p.uid: p for p in (pod_info(i) for i in out.get("items", [])) if p.uid}
        self._pods_read = True
        self._reported = {k for k in self._reported if k[0] in self._pods}
        return True

    def _check_env(self, now: float) -> None:
        """Each new process of a gpupack pod's container, once: its env against the allocation
        (agent.enforce.envcheck); a mismatch is a WRONG_ENV violation (Event on the pod, once per pod)."""
        if self.procs is None:
            return
        alive = set(self.procs.pids())
        self._env_done &= alive
        self._env_waiting = {p: t for p, t in self._env_waiting.items() if p in alive}
        self._env_relist = False
        found: list[verify.Violation] = []
        for pid in sorted(alive - self._env_done):
            ref = self.procs.pod_of(pid)
            pod = self._pods.get(ref.pod_uid) if ref is not None else None
            container = pod.containers.get(ref.container_id) if pod is not None and ref is not None else None
            if ref is None or not ref.container_id:
                self._env_done.add(pid)  # a host process, or a pod's sandbox cgroup
            elif pod is None or container is None:
                # Not listed yet (a new pod, a container the pod status does not name yet): list again,
                # once; a list taken after the process was first seen that still lacks it settles it.
                first = self._env_waiting.setdefault(pid, now)
                if first >= self._pods_at:
                    self._env_relist = True
                else:
                    self._env_done.add(pid)
            else:
                self._env_done.add(pid)
                raw = self.procs.environ(pid)
                if raw is None:
                    continue
                bad = envcheck.mismatches(pod, container, envcheck.parse_environ(raw))
                m.ENV_CHECKS.labels((m.EnvCheck.MISMATCH if bad else m.EnvCheck.OK).value).inc()
                if bad:
                    message = (
                        f"container {container} (pid {pid}) runs with {'; '.join(bad)}: the kubelet set "
                        "these from the allocation, so the image or its entrypoint overrides them"
                    )
                    found.append(verify.Violation(verify.Kind.WRONG_ENV, pod, "", -1, (pid,), message))
        self._handle_violations(verify.Verdict({}, (), tuple(found), ()), now)

    def _tell_daemon_lost(self, shared: set[str], now: float) -> None:
        """An Event on each pod placed on the node's shared GPUs: the MPS daemon's death ended their MPS
        clients (measured: CUDA_ERROR_MPS_RPC_FAILURE), so a failure they saw has this cause."""
        message = (
            "the node's MPS control daemon stopped: MPS clients on this node failed with "
            "CUDA_ERROR_MPS_RPC_FAILURE; new MPS containers wait until its pod has restarted it ("
            + self.mps.message
            + ")"
        )
        pods = [p for p in self._pods.values() if p.allocation and set(p.allocation.gpu_uuids) & shared]
        _log.warning("MPS control daemon lost", extra={"pods": [f"{p.namespace}/{p.name}" for p in pods]})
        for p in pods:
            event = verify.pod_event(
                namespace=p.namespace, name=p.name, uid=p.uid, reason=DAEMON_LOST, message=message,
                node=self.config.node, now=now,
            )  # fmt: skip
            self._try("event", event)

    def _handle_violations(self, verdict: verify.Verdict, now: float) -> None:
        for v in verdict.violations:
            if v.key in self._reported:
                continue
            self._reported.add(v.key)
            m.VIOLATIONS.labels(v.kind.value).inc()
            _log.warning(
                "allocation violated",
                extra={"kind": v.kind.value, "pod": f"{v.pod.namespace}/{v.pod.name}", "gpu": v.gpu_index,
                       "error": v.message},
            )  # fmt: skip
            self._try("event", verify.event(v, self.config.node, now))
            if self.config.evict_on_violation and v.kind in (verify.Kind.WRONG_GPU, verify.Kind.OVER_MEMORY):
                self._try("eviction", verify.eviction(v))

    def _enforce(
        self, sample: NodeSample, spec: GPUNodeSpec, refs: dict[int, PodRef | None], verdict: verify.Verdict,
        now: float,
    ) -> None:  # fmt: skip
        """The watchdog: end each process on a shared GPU that is not where its allocation says
        (agent.enforce.watchdog), put an Event on its pod, evict a pod that keeps doing it."""
        policy, hands = self.config.watchdog, self.hands
        if policy is None or hands is None:
            return
        shared = frozenset(g.uuid for g in spec.shared_gpus)
        fictional = frozenset(self.fictional())
        pids = {p.pid for g in sample.gpus if g.uuid in shared for p in g.processes} - fictional
        if not pids:
            return  # nothing to judge: no need to ask the daemon or /proc
        mps_gpus, servers, clients = self._mps_facts(spec)
        facts = wd.Facts(
            shared_gpus=shared, mps_gpus=mps_gpus, mps_servers=servers, mps_clients=clients,
            comms={pid: hands.comm(pid) for pid in pids}, fictional=fictional,
        )  # fmt: skip
        decision = wd.decide(
            sample, refs, self._pods, verdict=verdict, metas=self._metas, facts=facts, policy=policy
        )
        if decision.unknown_pods and now - self._metas_at >= self.config.reporter.min_interval_s:
            self._metas_at = now
            try:
                self._metas = wd.metas(self.send(wd.list_node_pods(self.config.node)).get("items", []))
            except KubeError as exc:
                _log.warning("listing the node's pods failed", extra={"code": exc.code, "error": exc.message})
            else:  # judge their processes now, not a cycle later
                decision = wd.decide(
                    sample, refs, self._pods, verdict=verdict, metas=self._metas, facts=facts, policy=policy
                )
        ended: list[wd.Ending] = []
        for e in decision.endings:
            done = hands.end(e.pid, refs.get(e.pid), e.mps_client)
            ran = "" if done.ran_s is None else f" after {done.ran_s:.1f} s"
            where = {"pid": e.pid, "gpu": e.gpu_index, "rule": e.rule.value}
            _log.warning("watchdog", extra={**where, "error": done.note + ran})
            if not done.signalled:
                continue
            ended.append(e)
            m.WATCHDOG_ENDED.labels(e.rule.value).inc()
            if done.ran_s is not None:
                m.WATCHDOG_RAN_SECONDS.observe(done.ran_s)
            if e.pod is not None:
                text = wd.message(e, done.note + ran)
                self._try("event", verify.pod_event(
                    namespace=e.pod.namespace, name=e.pod.name, uid=e.pod.uid, reason=wd.REASON, message=text,
                    node=self.config.node, now=now,
                ))  # fmt: skip
        before = self._strikes
        self._strikes = {
            uid: n for uid, n in wd.strikes(before, ended).items() if uid in self._pods or uid in self._metas
        }
        for uid in wd.to_evict(before, self._strikes, policy):
            meta = self._metas.get(uid) or next(
                (wd.PodMeta(p.uid, p.namespace, p.name, {}) for p in (self._pods.get(uid),) if p), None
            )
            if meta is None:
                continue
            text = (
                f"evicted: {self._strikes[uid]} of its processes were ended on shared GPUs "
                f"(the watchdog evicts after {policy.evict_after})"
            )
            self._try("event", verify.pod_event(
                namespace=meta.namespace, name=meta.name, uid=uid, reason=wd.EVICTED_REASON, message=text,
                node=self.config.node, now=now,
            ))  # fmt: skip
            self._try("eviction", calls.eviction(meta.namespace, meta.name, uid=uid))

    def _mps_facts(self, spec: GPUNodeSpec) -> tuple[frozenset[str], frozenset[int], frozenset[int] | None]:
        """The GPUs MPS serves, the daemon's servers and its clients (None: unknown this cycle).

        No daemon listening (no control socket, or one left by a daemon that died): no process is a client,
        each has a context of its own (measured: a client without a live daemon runs without MPS). A daemon
        that does not answer in time: unknown, and no process is judged for not being a client."""
        if not self.mps.available():
            return frozenset(), frozenset(), None
        # Every shared GPU: MPS clients run on GPUs left in DEFAULT too; `isolation: none` pods there are
        # told apart by their own request (agent.enforce.watchdog).
        gpus = frozenset(g.uuid for g in spec.shared_gpus)
        control = self.mps.control
        if nothing_listens(control.pipe_dir / "control"):
            return gpus, frozenset(), frozenset()
        servers = control.server_list()
        if isinstance(servers, str):
            return gpus, frozenset(), None
        clients: set[int] = set()
        for server in servers:
            listed = control.client_list(server)
            if isinstance(listed, str):
                return gpus, frozenset(servers), None
            clients.update(listed)
        return gpus, frozenset(servers), frozenset(clients)

    def _try(self, kind: str, req: Request) -> None:
        try:
            self.send(req)
        except KubeError as exc:
            self._count_write(kind, "error")
            _log.warning("write failed", extra={"kind": kind, "code": exc.code, "error": exc.message})
        else:
            self._count_write(kind, "ok")

    def _update_metrics(self, sample: NodeSample, verdict: verify.Verdict) -> None:
        # Set this cycle's series first, then drop those that vanished, so a scrape never sees a gap.
        seen: dict[Any, set[tuple[str, ...]]] = {}

        def put(gauge: Any, labels: tuple[str, ...], value: float | None) -> None:
            if value is not None:
                gauge.labels(*labels).set(value)
                seen.setdefault(gauge, set()).add(labels)

        for g in sample.gpus:
            lab = (str(g.index), g.uuid)
            util = None if g.utilization_percent is None else g.utilization_percent / 100
            foreign = sum(1 for p in g.processes if not verdict.owners.get(p.pid))
            put(m.GPU_HEALTHY, lab, 1 if g.healthy else 0)
            put(m.GPU_MEMORY_TOTAL_MIB, lab, g.memory_total_mib)
            put(m.GPU_MEMORY_USED_MIB, lab, g.memory_used_mib)
            put(m.GPU_UTILIZATION_RATIO, lab, util)
            put(m.GPU_PROCESSES, (*lab, "pod"), len(g.processes) - foreign)
            put(m.GPU_PROCESSES, (*lab, "foreign"), foreign)
            put(
                m.GPU_MEMORY_BORROWED_MIB,
                lab,
                sum(u.borrowed_mib for u in verdict.usage if u.gpu_uuid == g.uuid),
            )
        for u in verdict.usage:
            pod_lab = (u.pod.namespace, u.pod.name, str(u.gpu_index))
            put(m.POD_MEMORY_USED_MIB, pod_lab, u.used_mib)
            put(m.POD_MEMORY_LIMIT_MIB, pod_lab, u.limit_mib)
        for gauge, before in self._series.items():
            for labels in before - seen.get(gauge, set()):
                gauge.remove(*labels)
        self._series = seen
        m.MPS_UP.set(1 if self.mps.state is MpsState.RUNNING else 0)

    def heartbeat_age(self) -> float:
        last = self.reporter.last_heartbeat
        return float("nan") if last is None else self.clock() - last
