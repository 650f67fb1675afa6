"""The agent's answer to the RuntimeClass handler: a unix socket, one JSON line in, one JSON line out.

Each connection carries one question (agent.runtime.nodeside). At a container's `create` the pod is taken
from the agent's watch of the node's pods (agent.runtime.nodepods), and read from the apiserver by name only
where the watch has not shown it yet or its view would refuse (`read_pod`, a fresh read); its grant is
decided by agent.runtime.nodeside and kept (agent.runtime.grants) for the same container's hook, stop and
delete, and the pod's MPS directory prepared by agent.mpsdaemon.pipedirs. Each answer is timed by question
(gpupack_agent_node_answer_seconds). Every failure is
an answer with a reason, never a dropped connection: the handler fails the container's OCI `create`
with it, which the pod's status shows. While the agent is down or restarting nothing listens, the
handler's connect fails, and it refuses the container with that.

Per-cgroup GPU memory limits (agent.enforce.memlimits, agent.enforce.limiter), where the node can carry them:
the create's
answer asks the handler for its createRuntime hook; the hook's `start` (the container's cgroup exists, its
first process has not run) is answered once the limits are set on that cgroup for every GPU of the
allocation, or refused (the container does not start); `delete` clears them. With MPS v3
(agent.mpsdaemon.mpsv3) each GPU container gets a namespace of its own at create, deleted with it.

A stop of a running container (`runc kill`, `runc delete --force`, seen by the handler before it passes
them on) is a `stop` carrying the container's host pids: its MPS clients are ended through the daemon first
(agent.mpsdaemon.drain), within `drain_timeout_s`, and the handler's stop goes on whatever the outcome; a
drain that did not finish is logged, counted and told to the pod with an Event (`GPUStopNotDrained`).

A maintenance thread renews the pods' links to the MPS daemon, removes the directories of pods that left
the node, and clears limits and namespaces of containers whose pod has left (a delete the agent missed).
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.enforce import memlimits, verify
from agent.enforce.limiter import Limiter, Record
from agent.enforce.memlimits import Capability
from agent.metrics import (
    MPS_STOP_DRAINS,
    NODE_ANSWER_SECONDS,
    WRITES,
    AgentWrite,
    AgentWriteResult,
    DrainOutcome,
    Question,
)
from agent.mpsdaemon.drain import ClientLists, Drained, drain
from agent.mpsdaemon.mpsv3 import Namespaces
from agent.mpsdaemon.pipedirs import PipeDirs
from agent.runtime import nodeside
from agent.runtime.grants import Grants
from app.core import log, podview
from app.core.errors import KubeError
from app.core.podview import PodView
from app.kube import paths
from app.kube.calls import Request
from app.kube.informers import Informer

_log = log.get("gpupack.agent.nodeside")

MAX_LINE = 64 * 1024
READ_TIMEOUT_S = 5.0
MAINTENANCE_S = 30.0
DRAIN_TIMEOUT_S = 5.0
NOT_DRAINED = "GPUStopNotDrained"


def read_pod(namespace: str, name: str) -> Request:
    """One pod as a list by name (the agent's RBAC lists pods and needs no `get` for this), fresh (no
    resourceVersion: a consistent read, the pod as etcd has it)."""
    return Request("GET", paths.pods(namespace), query={"fieldSelector": f"metadata.name={name}"})


def runqueue_s() -> float | None:
    """Seconds the calling thread has waited, runnable, for a CPU (the second field of
    /proc/thread-self/schedstat); None where the kernel does not say. Logged per answer: an answer that took
    long while its thread waited for a CPU was starved, one that did not waited on what it called."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class AgentSocket(socketserver.ThreadingUnixStreamServer):
    """The node side's listening socket, a thread per question.

    Its accept queue is the kernel's largest (`SOMAXCONN`), not socketserver's 5: the kubelet creates and
    stops many containers at once (a Deployment scaled up, a node drained), each asks here at create, at its
    createRuntime hook and at its stop, and a unix socket whose queue is full refuses a non-blocking connect
    (the handler's) with EAGAIN instead of queueing it, which failed 30 pods started together."""

    request_queue_size = socket.SOMAXCONN


class NodeServer:
    """`start()` listens on `socket_path` (mode 0600: only root, as the handler runs); `stop()` ends."""

    def __init__(
        self,
        socket_path: Path,
        node: str,
        pipe_dirs: PipeDirs,
        send: Callable[[Request], dict[str, Any]],
        *,
        maintenance_s: float = MAINTENANCE_S,
        mps_not_ready: Callable[[Sequence[str]], str] = nodeside.always_ready,
        daemon_not_ready: Callable[[], str] = lambda: "",
        limiter: Limiter | None = None,
        capability: Callable[[], Capability] = lambda: Capability(False, "not configured"),
        namespaces: Namespaces | None = None,
        gpu_mounts: Sequence[nodeside.Mount] = (),
        mps_clients: ClientLists | None = None,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
        watched: Callable[[str, str], PodView | None] = lambda namespace, name: None,
        pod_watch: Informer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.socket_path = socket_path
        self.node = node
        self.pipe_dirs = pipe_dirs
        self.send = send
        self.maintenance_s = maintenance_s
        self.mps_not_ready = mps_not_ready
        # Why the MPS daemon may serve no new client now (agent.mpsdaemon.mps.MpsSupervisor.not_ready): its
        # defaults not applied and read back on the daemon behind the socket. A client started then would
        # run without them.
        self.daemon_not_ready = daemon_not_ready
        self.limiter = limiter
        self.capability = capability
        self.namespaces = namespaces  # MPS v3: a namespace per GPU container (None: the pod's own dir)
        self.gpu_mounts = tuple(gpu_mounts)  # e.g. the simulated allocator's socket directory
        self.drain_timeout_s = drain_timeout_s  # 0: stops are not drained
        # The node's one listing of the daemon's clients (None: no MPS), shared by the stops that arrive
        # together and with the watchdog's drains (agent.main.mps_client_lists).
        self.mps_clients = mps_clients
        # The pod by namespace and name as the agent's watch of the node's pods last showed it
        # (agent.runtime.nodepods.NodePods.of), kept in step by `pod_watch`, which start() and stop() run.
        self.watched = watched
        self.pod_watch = pod_watch
        self.clock = clock
        # This thread's apiserver reads for the answer it is giving (seconds each), for its log line.
        self._reads = threading.local()
        self.grants = Grants()  # each container's grant from its create, for its hook, stop and delete
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def reply(self, line: bytes) -> nodeside.Answer:
        """The answer to one request line; its time is counted by question (NODE_ANSWER_SECONDS)."""
        began, queued = time.perf_counter(), runqueue_s()
        self._reads.took = []
        question, answer = self._reply(line)
        seconds = time.perf_counter() - began
        NODE_ANSWER_SECONDS.labels(question=question).observe(seconds)
        waited = runqueue_s()
        _log.info(
            "node-side answer",
            extra={"request": line[:500].decode(errors="replace").strip(), "question": question.value,
                   "allowed": answer.allowed, "reason": answer.reason, "seconds": round(seconds, 4),
                   "reads": [round(s, 4) for s in self._reads.took],
                   "cpu_wait_s": None if waited is None or queued is None else round(waited - queued, 4)},
        )  # fmt: skip
        return answer

    def _reply(self, line: bytes) -> tuple[Question, nodeside.Answer]:
        try:
            raw = json.loads(line)
        except ValueError as exc:
            return Question.MALFORMED, nodeside.refuse(f"malformed request: not JSON ({exc})")
        message = nodeside.parse_message(raw)
        if isinstance(message, str):
            return Question.MALFORMED, nodeside.refuse(message)
        if isinstance(message, nodeside.Ended):
            return Question.DELETE, self._ended(message)
        if isinstance(message, nodeside.Stopping):
            return Question.STOP, self._stopping(message)
        if isinstance(message, nodeside.Start):
            # The grant its create decided; decided again from the pod only where this agent has none (it
            # restarted between the container's create and its hook).
            kept = self.grants.of(message.ask.container_id, message.ask.pod_uid)
            grant = kept if kept is not None else self._grant(message.ask)
            started = grant if isinstance(grant, nodeside.Answer) else self._start(message, grant)
            return Question.START, started
        return Question.CREATE, self._created(message)

    def _created(self, message: nodeside.Ask) -> nodeside.Answer:
        grant = self._grant(message)
        if isinstance(grant, nodeside.Answer):
            return grant
        answer = self._create(message, grant)
        if answer.allowed:
            self.grants.keep(message.container_id, message.pod_uid, grant)
        return answer

    def _grant(self, ask: nodeside.Ask) -> nodeside.Grant | nodeside.Answer:
        """The container's grant from the pod as the agent's watch has shown it; where that grants nothing (a
        pod the watch has not shown yet, or a refusal), from a fresh read of the apiserver, so a refusal is
        always decided on the pod as etcd has it."""
        seen = self.watched(ask.namespace, ask.name)
        if seen is not None:
            granted = nodeside.decide(ask, seen, self.node, self.mps_not_ready)
            if isinstance(granted, nodeside.Grant):
                return granted
        read = self._read(ask)
        if isinstance(read, nodeside.Answer):
            return read
        return nodeside.decide(ask, read, self.node, self.mps_not_ready)

    def _read(self, ask: nodeside.Ask) -> PodView | nodeside.Answer | None:
        """The pod as etcd has it (None: there is none by that name), or the refusal to give when the
        apiserver cannot be read."""
        began = time.perf_counter()
        try:
            listed = self.send(read_pod(ask.namespace, ask.name))
        except KubeError as exc:
            return nodeside.refuse(
                f"the agent cannot read {ask.where} from the apiserver ({exc.code}: {exc.message})"
            )
        finally:
            self._reads.took.append(time.perf_counter() - began)
        items = listed.get("items") or []
        return podview.read(items[0]) if items else None

    def _enforced(self, grant: nodeside.Grant) -> bool:
        return grant.limits is not None and self.limiter is not None and self.capability().available

    def _create(self, ask: nodeside.Ask, grant: nodeside.Grant) -> nodeside.Answer:
        mps_dir: str | None = None
        # The daemon's socket first (a daemon that does not answer, said as such), then the daemon as this
        # agent knows it (its defaults held, a server started).
        if grant.mps and (down := self.pipe_dirs.backend_down()):
            return nodeside.refuse(down)
        if grant.mps and (why := self.daemon_not_ready()):
            return nodeside.refuse(
                f"container {ask.container!r} of {ask.where} would be an MPS client: {why}"
            )
        if grant.mps and self.namespaces is not None and self.limiter is not None and grant.limits:
            ns = memlimits.namespace_name(ask.container_id)
            made = self.namespaces.create(ns, grant.thread_percentage, grant.limits.hard_mib)
            if isinstance(made, str):
                return nodeside.refuse(made)
            # Remembered now: a container whose create fails later is still cleaned up (delete, sweep).
            self.limiter.remember(Record(ask.container_id, ask.pod_uid, "", (), 0, 0, mps_namespace=ns))
            mps_dir = str(made)
        elif grant.mps:
            prepared = self.pipe_dirs.ensure(ask.pod_uid)
            if isinstance(prepared, str):
                return nodeside.refuse(prepared)
            mps_dir = str(prepared)
        return nodeside.answer(grant, mps_dir, hook=self._enforced(grant), extra=self.gpu_mounts)

    def _start(self, start: nodeside.Start, grant: nodeside.Grant) -> nodeside.Answer:
        """Set the container's limits on its own cgroup, before its first process; refuse if they cannot
        be (the hook fails, runc's create fails, the container does not start)."""
        if grant.limits is None or self.limiter is None:
            return nodeside.Answer(True)
        cap = self.capability()
        if not cap.available:
            return nodeside.refuse(f"per-cgroup GPU memory limits are unavailable on this node: {cap.reason}")
        where = nodeside.cgroup_namespace(start, cap.cgroup_root)
        if where.startswith("refused: "):
            return nodeside.refuse(where.removeprefix("refused: "))
        ask = start.ask
        earlier = self.limiter.read(ask.container_id)
        limits = grant.limits
        record = Record(
            ask.container_id, ask.pod_uid, where, grant.gpu_uuids, limits.soft_mib, limits.hard_mib,
            mps_namespace=earlier.mps_namespace if earlier else "",
        )  # fmt: skip
        why = self.limiter.apply(record)
        if why:
            return nodeside.refuse(why)
        return nodeside.Answer(True)

    def _stopping(self, stop: nodeside.Stopping) -> nodeside.Answer:
        """End the stopping container's MPS clients through the daemon before the handler signals them.
        Refused (allowed=False) only to tell the handler the drain did not finish: it stops anyway."""
        if self.mps_clients is None or self.drain_timeout_s <= 0:
            MPS_STOP_DRAINS.labels(outcome=DrainOutcome.OFF).inc()
            return nodeside.Answer(True, "not drained: draining is off")
        kept = self.grants.of(stop.ask.container_id, stop.ask.pod_uid)
        if kept is not None and not kept.mps:  # granted no MPS directory at create: no client to end
            MPS_STOP_DRAINS.labels(outcome=DrainOutcome.NO_CLIENTS).inc()
            return nodeside.Answer(True)
        done = drain(self.mps_clients, stop.pids, self.drain_timeout_s)
        ask = stop.ask
        fields = {"container_id": ask.container_id, "pod": f"{ask.namespace}/{ask.name}",
                  "ended": len(done.ended), "seconds": round(done.seconds, 3)}  # fmt: skip
        if done.complete:
            outcome = DrainOutcome.DRAINED if done.ended else DrainOutcome.NO_CLIENTS
            MPS_STOP_DRAINS.labels(outcome=outcome).inc()
            if done.ended:
                _log.info("MPS clients ended through the daemon before the stop", extra=fields)
            return nodeside.Answer(True)
        MPS_STOP_DRAINS.labels(outcome=DrainOutcome.INCOMPLETE).inc()
        why = _not_drained(stop, done)
        _log.warning("stop not drained", extra={**fields, "error": why})
        self._tell(stop.ask, why)
        return nodeside.refuse(why)

    def _tell(self, ask: nodeside.Ask, message: str) -> None:
        event = verify.pod_event(
            namespace=ask.namespace, name=ask.name, uid=ask.pod_uid, reason=NOT_DRAINED, message=message,
            node=self.node, now=self.clock(),
        )  # fmt: skip
        try:
            self.send(event)
        except KubeError as exc:
            WRITES.labels(kind=AgentWrite.EVENT, result=AgentWriteResult.ERROR).inc()
            _log.warning("Event not written", extra={"reason": NOT_DRAINED, "error": exc.message})
            return
        WRITES.labels(kind=AgentWrite.EVENT, result=AgentWriteResult.OK).inc()

    def _ended(self, ended: nodeside.Ended) -> nodeside.Answer:
        self.grants.forget(ended.container_id)
        if self.limiter is not None:
            self.limiter.clear(ended.container_id)
        return nodeside.Answer(True)

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)  # a previous agent's: nothing listens there any more
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = READ_TIMEOUT_S

            def handle(self) -> None:
                try:
                    line = self.rfile.readline(MAX_LINE)
                except OSError:
                    return
                try:
                    answer = outer.reply(line)
                except Exception as exc:  # a bug here must still reach the pod as a reason
                    _log.exception("node-side answer failed")
                    answer = nodeside.refuse(f"the gpupack agent failed to answer ({type(exc).__name__})")
                self.wfile.write(json.dumps(answer.to_json()).encode() + b"\n")

        old = os.umask(0o177)
        try:
            self._server = AgentSocket(str(self.socket_path), Handler)
        finally:
            os.umask(old)
        self._server.daemon_threads = True
        self._threads = [
            threading.Thread(target=self._server.serve_forever, name="node-side", daemon=True),
            threading.Thread(target=self._maintain, name="node-side-maintenance", daemon=True),
        ]
        for t in self._threads:
            t.start()
        if self.pod_watch is not None:
            self._threads.append(self.pod_watch.start())
        _log.info("node side listening", extra={"socket": str(self.socket_path)})

    def stop(self) -> None:
        self._stop.set()
        if self.pod_watch is not None:
            self.pod_watch.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self.socket_path.unlink(missing_ok=True)
        for t in self._threads:
            t.join(timeout=5)

    def maintain_once(self) -> None:
        self.pipe_dirs.refresh()
        try:
            listed = self.send(verify.list_pods(self.node))
        except KubeError as exc:
            _log.warning("node-side maintenance: listing pods failed", extra={"error": exc.message})
            return
        keep = {str((p.get("metadata") or {}).get("uid") or "") for p in listed.get("items", [])}
        self.grants.prune(keep)
        removed = self.pipe_dirs.prune(keep, older_than_s=2 * self.maintenance_s)
        if removed:
            _log.info("removed MPS directories of pods gone from the node", extra={"pods": removed})
        if self.limiter is not None:
            cleared = self.limiter.sweep(keep, older_than_s=2 * self.maintenance_s)
            if cleared:
                ids = [r.container_id for r in cleared]
                _log.info("cleared limits of containers whose pod left the node", extra={"containers": ids})

    def _maintain(self) -> None:
        while not self._stop.wait(self.maintenance_s):
            try:
                self.maintain_once()
            except Exception:
                _log.exception("node-side maintenance failed")


def _not_drained(stop: nodeside.Stopping, done: Drained) -> str:
    clients = ", ".join(str(c) for _, c in done.left) or "unknown"
    return (
        f"container {stop.ask.container!r} was stopped before its MPS clients ({clients}) were ended "
        f"through the MPS daemon ({done.problem}): GPU work of other pods on its GPU may have failed"
    )
