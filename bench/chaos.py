"""Is a GPU share ever handed out twice or forgotten while the control plane is broken on purpose?

A real local control plane (tests.devcluster: etcd, kube-apiserver, kube-scheduler, kwok) with N kwok GPU
nodes, our webhook (registered with the apiserver) and two extender replicas behind the fault points of
tests.devcluster.faults.ExtenderRig. Pods of mixed shapes (0.25 / 0.5 / 0.3 / 1.0 of a GPU, gpu-memory 8Gi,
0.5 on each of 2 GPUs) are created as users write them (annotations only: the webhook mutates them) at a
steady rate, while fault rounds are injected, one kind after another:
  sever       the extenders' connections to the apiserver are reset and refused for 3 s
  slow-bind   the extenders' API path is frozen until kube-scheduler logs an extender bind timeout
  apiserver   kube-apiserver is SIGKILLed and started again (same port, certs, flags; etcd keeps the data)
  leader      the leading extender is SIGSTOPped until the standby took the lease and bound a pod; SIGCONT
Afterwards: over-committed GPUs, bound pods without an allocation, allocations naming another node,
pods still pending, holds left in each replica's assume cache, and per fault the seconds from its start
(and from its end) to the first bind of a pod created after that moment (so no bind that was already
under way counts; the bind clock polls every 0.25 s).

Usage: .venv/bin/python bench/chaos.py [--pods 240] [--rounds 8] [--nodes 24] [--rate 3]
Writes bench/results/chaos.json and prints a summary table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core import names  # noqa: E402
from tests.devcluster import Cluster, WaitTimeoutError, ensure_binaries, wait_for  # noqa: E402
from tests.devcluster.faults import ExtenderRig, audit, publish_gpunodes  # noqa: E402

MODEL = "A100-40GB"
GPUS = 8
NAMESPACE = "chaos"
KINDS = ("sever", "leader", "slow-bind", "apiserver")
# As users write them; the webhook turns them into resources, labels and env.
SHAPES: tuple[dict[str, str], ...] = (
    {names.GPU_FRACTION: "0.25"},
    {names.GPU_FRACTION: "0.5"},
    {names.GPU_FRACTION: "0.3"},
    {names.GPU_FRACTION: "1.0"},
    {names.GPU_MEMORY: "8Gi"},
    {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_NUM_DEVICES: "2"},
)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def user_pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i:04d}", "annotations": dict(SHAPES[i % len(SHAPES)])},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


class BindClock:
    """Polls the namespace; remembers when each pod was first seen bound (the poll's start time)."""

    def __init__(self, core: Any, interval_s: float = 0.25) -> None:
        self.core = core
        self.interval_s = interval_s
        self.first_bound: dict[str, float] = {}
        self.pods: list[dict[str, Any]] = []
        self.failed_polls = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bind-clock", daemon=True)

    def poll(self) -> list[dict[str, Any]] | None:
        t = time.time()
        try:
            resp = self.core.list_namespaced_pod(NAMESPACE, _preload_content=False, _request_timeout=5)
            pods: list[dict[str, Any]] = json.loads(resp.data)["items"]
        except Exception:  # the apiserver is down (restart round): try again next tick
            self.failed_polls += 1
            return None
        with self._lock:
            self.pods = pods
            for p in pods:
                name = p["metadata"]["name"]
                if (p.get("spec") or {}).get("nodeName") and name not in self.first_bound:
                    self.first_bound[name] = t
        return pods

    def bound(self) -> set[str]:
        with self._lock:
            return set(self.first_bound)

    def first_after(self, before: set[str], since: float) -> float | None:
        """Time of the first bind of a pod not bound in `before`, seen at or after `since`."""
        with self._lock:
            times = [t for n, t in self.first_bound.items() if n not in before and t >= since]
        return min(times) if times else None

    def first_of_created(self, created: dict[str, float], since: float) -> float | None:
        """When the first pod created at or after `since` was seen bound: such a pod cannot have been
        bound before `since`, so this is the first bind that had to pass through the fault."""
        with self._lock:
            times = [t for n, t in self.first_bound.items() if created.get(n, 0.0) >= since]
        return min(times) if times else None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)

    def start(self) -> BindClock:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class Creator:
    """Creates the pods at a steady rate; a create the apiserver cannot take now is retried."""

    def __init__(self, core: Any, count: int, rate: float) -> None:
        self.core, self.count, self.rate = core, count, rate
        self.created = 0
        self.created_at: dict[str, float] = {}  # pod name -> time.time() its create returned
        self.retries = 0
        self.error: str = ""
        self._thread = threading.Thread(target=self._run, name="creator", daemon=True)

    def _create(self, body: dict[str, Any]) -> None:
        from kubernetes.client.rest import ApiException

        deadline = time.monotonic() + 180
        while True:
            try:
                self.core.create_namespaced_pod(NAMESPACE, body, _request_timeout=10)
                return
            except ApiException as exc:
                if exc.status == 409:  # an earlier try went through; its reply was lost
                    return
                if (exc.status < 500 and exc.status != 429) or time.monotonic() > deadline:
                    raise
            except Exception:  # refused/reset while the apiserver restarts
                if time.monotonic() > deadline:
                    raise
            self.retries += 1
            time.sleep(0.2)

    def _run(self) -> None:
        t0 = time.monotonic()
        try:
            for i in range(self.count):
                wait = t0 + i / self.rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                body = user_pod(i)
                self._create(body)
                self.created_at[body["metadata"]["name"]] = time.time()
                self.created += 1
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"[:300]

    def start(self) -> Creator:
        self._thread.start()
        return self

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout=timeout_s)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


@dataclass
class Round:
    kind: str
    started: float
    healed: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)
    first_bind: float | None = None  # first bind of a pod created after the fault started
    first_bind_healed: float | None = None  # first bind of a pod created after the fault ended

    def to_json(self, t0: float) -> dict[str, Any]:
        fb, fh = self.first_bind, self.first_bind_healed
        return {
            "kind": self.kind,
            "at_s": round(self.started - t0, 2),
            "fault_s": round(self.healed - self.started, 2),
            "first_bind_after_start_s": None if fb is None else round(fb - self.started, 2),
            "first_bind_after_heal_s": None if fh is None else round(fh - self.healed, 2),
            **self.detail,
        }


class Faults:
    """One function per fault kind; each returns when the fault is over (healed), with what it saw."""

    def __init__(self, cluster: Cluster, rig: ExtenderRig, clock: BindClock) -> None:
        self.cluster, self.rig, self.clock = cluster, rig, clock

    def sever(self) -> dict[str, Any]:
        refuse_s = 3.0
        cut = self.rig.sever_api(refuse_s=refuse_s)
        time.sleep(refuse_s)  # the fault lasts while new connections are refused
        self.rig.wait_leader(60)
        return {"connections_cut": cut}

    def slow_bind(self) -> dict[str, Any]:
        log = self.cluster.log_path("kube-scheduler")
        offset = log.stat().st_size

        def timed_out() -> bool:
            with log.open("rb") as fh:
                fh.seek(offset)
                text = fh.read().decode("utf-8", "replace")
            return any("/bind" in ln and ("Timeout" in ln or "deadline" in ln) for ln in text.splitlines())

        self.rig.freeze_api()
        try:
            wait_for(timed_out, 20, "an extender bind timeout in kube-scheduler's log")
            seen = True
        except WaitTimeoutError:
            seen = False  # no bind was in flight to time out: the freeze still stalled the extenders
        finally:
            self.rig.thaw_api()
        return {"scheduler_bind_timeout_seen": seen}

    def apiserver(self) -> dict[str, Any]:
        t = time.monotonic()
        self.cluster.restart_process("kube-apiserver")
        return {"apiserver_down_s": round(time.monotonic() - t, 2)}

    def leader(self) -> dict[str, Any]:
        old = self.rig.wait_leader(60)
        before = self.clock.bound()
        t = time.time()
        self.rig.freeze_replica(old)
        try:
            new = self.rig.wait_leader(60, but=old)
            handover = time.time() - t
            with contextlib.suppress(WaitTimeoutError):  # nothing pending now: still a handover
                wait_for(lambda: self.clock.first_after(before, t), 30, "a bind by the new leader")
        finally:
            self.rig.resume_replica(old)
        return {"frozen_replica": old, "new_leader": new, "handover_s": round(handover, 2)}

    def run(self, kind: str) -> dict[str, Any]:
        fn: Callable[[], dict[str, Any]] = {
            "sever": self.sever,
            "slow-bind": self.slow_bind,
            "apiserver": self.apiserver,
            "leader": self.leader,
        }[kind]
        return fn()


def scheduler_bind_timeouts(cluster: Cluster) -> int:
    text = cluster.log_path("kube-scheduler").read_text(errors="replace")
    return sum(1 for ln in text.splitlines() if "/bind" in ln and ("Timeout" in ln or "deadline" in ln))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from kubernetes import client

    from tests.devcluster.addons import WEBHOOK, Components, Definitions, webhook_spec

    bins = ensure_binaries()
    with tempfile.TemporaryDirectory(prefix="gpupack-chaos-") as tmp:
        cluster = Cluster.prepare(Path(tmp), bins)
        say("starting the control plane")
        cluster.start(progress=say)
        rig: ExtenderRig | None = None
        try:
            api = cluster.api_client()
            core = client.CoreV1Api(api)
            Definitions().start(cluster, [])
            nodes = cluster.create_gpu_nodes(args.nodes, GPUS, MODEL, prefix="chaos-")
            publish_gpunodes(cluster.kubeconfig, nodes, GPUS, MODEL)
            say(f"{len(nodes)} nodes x {GPUS} {MODEL}, GPUNodes published")
            cluster.start_process(
                webhook_spec(
                    cluster.webhook_port, cluster.webhook_cert_file, cluster.webhook_key_file, cluster.ca_file
                ),
                say,
            )
            Components().register_webhook(cluster)
            rig = ExtenderRig(
                cluster,
                replicas=2,
                policy=args.policy,
                lease_duration_s=args.lease,
                drain_on_failover=args.drain,
            ).start()
            say(f"extenders ready (leader: replica {rig.leader()})")
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            clock = BindClock(core).start()
            faults = Faults(cluster, rig, clock)
            t0 = time.time()
            creator = Creator(core, args.pods, args.rate).start()
            rounds: list[Round] = []
            made = creator.created_at  # filled by the creator thread as it goes
            for r in range(args.rounds):
                kind = KINDS[r % len(KINDS)]
                due = (r + 1) * args.pods // (args.rounds + 1)
                wait_for(lambda due=due: creator.created >= due or creator.done, 600, f"{due} pods created")
                before = clock.bound()
                rd = Round(kind, time.time())
                say(f"round {r + 1}/{args.rounds}: {kind} ({creator.created} created, {len(before)} bound)")
                rd.detail = faults.run(kind)
                rd.healed = time.time()
                try:
                    wait_for(
                        lambda rd=rd: (
                            clock.first_of_created(made, rd.started)
                            and clock.first_of_created(made, rd.healed)
                        ),
                        90,
                        "a pod created after the fault bound",
                    )
                except WaitTimeoutError:
                    say("  no new pod bound within 90 s after the fault")
                rd.first_bind = clock.first_of_created(made, rd.started)
                rd.first_bind_healed = clock.first_of_created(made, rd.healed)
                rounds.append(rd)
                say(f"  {json.dumps(rd.to_json(t0))}")
            creator.join(600)
            say(f"all {creator.created} pods created ({creator.retries} retried creates); waiting for binds")
            try:
                wait_for(lambda: len(clock.bound()) >= creator.created, args.settle, "every pod bound")
            except WaitTimeoutError:
                say(f"  {creator.created - len(clock.bound())} pods still pending after {args.settle}s")
            settled_s = time.time() - t0
            leader = rig.leader()
            held: dict[str, int | None] = {}
            if leader is not None:
                with contextlib.suppress(WaitTimeoutError):  # reported below either way
                    wait_for(lambda: rig.held(leader) == 0, 60, "the leader's holds drained")
            for i in range(rig.replicas):
                try:
                    held[rig.name(i)] = rig.held(i)
                except OSError:
                    held[rig.name(i)] = None
            clock.stop()
            pods = clock.poll() or clock.pods
            final = audit(pods)
            return {
                "nodes": args.nodes,
                "gpus_per_node": GPUS,
                "model": MODEL,
                "pods_created": creator.created,
                "create_retries": creator.retries,
                "creator_error": creator.error,
                "seconds_total": round(settled_s, 1),
                "rounds": [rd.to_json(t0) for rd in rounds],
                "audit": final.to_json(),
                "holds_left": held,
                "leader_at_end": None if leader is None else rig.name(leader),
                "scheduler_bind_timeouts": scheduler_bind_timeouts(cluster),
                "proxy": {
                    "api_severed": sum(a.stats.severed for a in rig.apis),
                    "api_refused": sum(a.stats.refused for a in rig.apis),
                    "router_drained_on_failover": rig.drained,
                    "router_refused": rig.router.stats.refused if rig.router else None,
                },
                "webhook_log": str(cluster.log_path(WEBHOOK)),
            }
        finally:
            if rig is not None:
                rig.stop()
            cluster.stop()


def table(res: dict[str, Any]) -> str:
    a = res["audit"]
    rows = [
        ("pods created / bound / pending", f"{res['pods_created']} / {a['bound']} / {a['pending']}"),
        ("over-committed GPUs", str(len(a["overcommitted_gpus"]))),
        ("bound pods without allocation", str(len(a["bound_without_allocation"]))),
        ("allocation node != pod node", str(len(a["allocation_node_mismatch"]))),
        ("pending pods holding an allocation", str(len(a["pending_with_allocation"]))),
        ("holds left (assume cache)", ", ".join(f"{k}={v}" for k, v in res["holds_left"].items())),
        ("scheduler bind timeouts", str(res["scheduler_bind_timeouts"])),
    ]
    width = max(len(r[0]) for r in rows)
    out = [f"{k:<{width}}  {v}" for k, v in rows]
    out.append("")
    out.append(f"{'round':<6}{'kind':<11}{'at s':>7}{'fault s':>9}{'bind after start':>18}{'after heal':>12}")
    for i, rd in enumerate(res["rounds"], 1):
        fs, fh = rd["first_bind_after_start_s"], rd["first_bind_after_heal_s"]
        out.append(
            f"{i:<6}{rd['kind']:<11}{rd['at_s']:>7.1f}{rd['fault_s']:>9.1f}"
            f"{'-' if fs is None else f'{fs:.1f}':>18}{'-' if fh is None else f'{fh:.1f}':>12}"
        )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=240)
    ap.add_argument("--rounds", type=int, default=8, help="fault rounds, kinds in turn: " + ", ".join(KINDS))
    ap.add_argument("--nodes", type=int, default=24, help=f"kwok nodes of {GPUS} GPUs")
    ap.add_argument("--rate", type=float, default=3.0, help="pods created per second")
    ap.add_argument("--policy", default="fragaware")
    ap.add_argument("--lease", type=int, default=3, help="extender lease duration, seconds")
    ap.add_argument("--settle", type=float, default=240, help="seconds to wait for the last binds")
    ap.add_argument(
        "--drain",
        action="store_true",
        help="also make the router drop its connections to a replica that stopped leading; by default it "
        "routes like a plain Service; the extender closes the scheduler's connection itself when not Ready",
    )
    ap.add_argument("--out", default=str(REPO / "bench/results/chaos.json"))
    args = ap.parse_args()
    if args.pods < 1 or args.rounds < 1:
        ap.error(f"--pods={args.pods} --rounds={args.rounds}: both must be >= 1")
    out: dict[str, Any] = {
        "inputs": vars(args),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        # The build machine is shared: a load average above the CPU count means contended timings.
        "loadavg_at_start": [round(x, 1) for x in os.getloadavg()],
    }
    out["result"] = run(args)
    out["loadavg_at_end"] = [round(x, 1) for x in os.getloadavg()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(table(out["result"]), flush=True)
    ok = not any(out["result"]["audit"][k] for k in ("overcommitted_gpus", "bound_without_allocation"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
