"""`gpupack repack`: plan (and, with --apply, carry out) the evictions that free whole GPUs or nodes."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from app.core import names
from app.core.errors import FieldError, InputError, KubeError
from app.core.model import Demand
from app.core.placement import DEFAULT_POLICY, registry
from app.core.pods import pod_info
from app.kube import snapshot
from app.kube.cache import ClusterCache
from app.kube.client import Kube
from app.tools.repack import candidates
from app.tools.repack.apply import Executor, Report, Step
from app.tools.repack.plan import Goal, GpuRef, Plan, PodRef, plan
from app.tools.repack.room import DEFAULT_MAX_MOVES, Room, make_room

EXIT_STOPPED = 3  # --apply stopped at a surprise


def _count(flag: str) -> Any:
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()):
            raise argparse.ArgumentTypeError(str(FieldError(flag, text, "must be a whole number >= 0")))
        return int(text)

    return parse


POD_KEY = re.compile(r"[^/\s]+/[^/\s]+")


def pod_key_arg(flag: str) -> Any:
    """An argparse type: NAMESPACE/NAME, refused with the flag, the value and the rule."""

    def parse(text: str) -> str:
        if not POD_KEY.fullmatch(text):
            raise argparse.ArgumentTypeError(str(FieldError(flag, text, "must be NAMESPACE/NAME")))
        return text

    return parse


def seconds_arg(flag: str) -> Any:
    """An argparse type: a number of seconds > 0, refused with the flag, the value and the rule."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not (0 < value < math.inf):  # also refuses nan
            raise argparse.ArgumentTypeError(str(FieldError(flag, text, "must be a number of seconds > 0")))
        return value

    return parse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "repack",
        help="free whole GPUs (or nodes) by evicting pods their controllers re-create elsewhere",
        description="Plan evictions that let the extender pack running pods onto fewer GPUs. Only pods "
        "a ReplicaSet, StatefulSet, Job or ReplicationController re-creates move; gpupack.io/movable: "
        '"false" protects a pod; PodDisruptionBudgets are honoured. Without --apply nothing changes.',
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--plan", action="store_true", help="print the plan (the default)")
    mode.add_argument("--apply", action="store_true", help="carry the plan out, one eviction at a time")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--goal", choices=[Goal.GPUS.value, Goal.NODES.value], default=Goal.GPUS.value, help="what to free"
    )
    p.add_argument(
        "--policy",
        choices=registry.names(),
        default=DEFAULT_POLICY,
        help=f"the extender's placement policy, used to predict where replacements land ({DEFAULT_POLICY})",
    )
    p.add_argument(
        "--for",
        dest="for_pod",
        type=pod_key_arg("--for"),
        metavar="NAMESPACE/POD",
        help="instead: the fewest moves after which this Pending gpupack pod fits (at most --max-evictions, "
        f"default {DEFAULT_MAX_MOVES})",
    )
    p.add_argument("--max-evictions", type=_count("--max-evictions"), help="evict at most this many pods")
    p.add_argument("--namespace", help="move only pods of this namespace (others stay where they are)")
    p.add_argument("--dry-run", action="store_true", help="with --apply: server-side dry-run evictions only")
    p.add_argument(
        "--from", dest="from_file", help="with --apply: carry out this saved `--plan --json` output"
    )
    p.add_argument(
        "--timeout",
        type=seconds_arg("--timeout"),
        default=120.0,
        help="seconds to wait for a budget, a replacement or a pod's exit before stopping (120)",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=seconds_arg("--heartbeat-timeout"),
        help="the extender's --heartbeat-timeout: older GPUNodes take no pods (default: each agent's own)",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.set_defaults(func=run)


def compute(
    snap: snapshot.Snapshot,
    cache: ClusterCache,
    *,
    goal: Goal,
    policy: str,
    max_evictions: int | None,
    namespace: str | None,
) -> Plan:
    """The plan for a listed cluster, as the extender would place every replacement."""
    pods, budgets = _running(snap, cache, namespace)
    nodes = [n for n in cache.nodes().values() if n is not None]
    return plan(nodes, pods, budgets, registry.create(policy), goal=goal, max_evictions=max_evictions)


def _running(
    snap: snapshot.Snapshot, cache: ClusterCache, namespace: str | None
) -> tuple[list[PodRef], dict[str, int]]:
    """Every running gpupack pod as the planner sees it (only `namespace`'s may move), and the budgets."""
    budgets = candidates.budgets_of(snap.pdbs)
    infos = {p.uid: p for p in cache.pods()}
    pods = candidates.pod_refs(snap.pods, infos, budgets, snap.nodes)
    if namespace:
        pods = [
            p
            if p.key.startswith(f"{namespace}/")
            else candidates.with_block(p, f"not in namespace {namespace}")
            for p in pods
        ]
    return pods, candidates.budget_map(budgets)


def compute_room(
    snap: snapshot.Snapshot,
    cache: ClusterCache,
    key: str,
    *,
    policy: str,
    max_moves: int,
    namespace: str | None,
) -> Room:
    """The fewest moves after which the Pending pod `key` fits; an InputError naming --for when none do."""

    def bad(rule: str) -> InputError:
        return InputError([FieldError("--for", key, rule)])

    ns, name = key.split("/", 1)
    pod = next((p for p in snap.pods if (pod_info(p).namespace, pod_info(p).name) == (ns, name)), None)
    if pod is None:
        raise bad(f"must name a gpupack pod (label {names.LABEL_MANAGED})")
    info = pod_info(pod)
    if not info.pending:
        where = f"bound to {info.node_name}" if info.node_name else f"{info.phase}, deleting={info.deleting}"
        raise bad(f"must be a Pending pod, not yet bound ({where})")
    if not isinstance(info.demand, Demand):
        raise bad(f"must have a valid GPU request ({'; '.join(map(str, info.demand))})")
    pods, budgets = _running(snap, cache, namespace)
    nodes = [n for n in cache.nodes(exclude_uid=info.uid).values() if n is not None]
    room = make_room(
        nodes,
        [p for p in pods if p.uid != info.uid],
        budgets,
        registry.create(policy),
        info.demand,
        allowed=candidates.allowed_nodes(pod, snap.nodes),
        max_moves=max_moves,
    )
    if room is None:
        raise bad(
            f"must fit after {max_moves} moves or fewer of movable pods; none make room for it "
            "(a pod moves only where the extender would place it now, off the room)"
        )
    return room


def _gpu(node: str, indexes: tuple[int, ...]) -> str:
    return f"{node}/gpu{','.join(str(i) for i in indexes)}"


def _refs(refs: tuple[GpuRef, ...]) -> str:
    return " ".join(f"{n}/gpu{i}" for n, i in refs) or "-"


def render_plan(p: Plan) -> str:
    lines = _table(p)
    lines.append(
        f"\n{p.evictions} evictions free {len(p.freed_gpus)} GPUs and {len(p.freed_nodes)} whole nodes "
        f"(goal {p.goal}, policy {p.policy})"
    )
    return "\n".join(lines + _kept(p))


def render_room(key: str, room: Room) -> str:
    lines = _table(room.plan)
    lines.append(
        f"\n{room.plan.evictions} evictions make room for {key} on {_gpu(room.node, room.gpus)} "
        f"(policy {room.plan.policy})"
    )
    return "\n".join(lines + _kept(room.plan))


def _kept(p: Plan) -> list[str]:
    if not p.kept:
        return []
    return [f"kept in place: {len(p.kept)} pods"] + [f"  {pod}: {why}" for pod, why in p.kept]


def _table(p: Plan) -> list[str]:
    rows = [("POD", "FROM", "TO", "GPUS FREED")]
    rows += [
        (
            m.pod,
            _gpu(m.source.node, m.source.gpu_indexes),
            _gpu(m.target.node, m.target.gpu_indexes),
            _refs(m.frees),
        )
        for m in p.moves
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}" for a, b, c, d in rows]


def render_step(s: Step) -> str:
    where = f" -> {s.replacement} on {_gpu(s.landed.node, s.landed.gpu_indexes)}" if s.landed else ""
    detail = f": {s.detail}" if s.detail else ""
    return f"{s.outcome:<8} {s.move.pod}{where}{detail}"


def render_report(r: Report) -> str:
    stop = r.stopped
    tail = f"stopped at {stop.move.pod} ({stop.outcome})" if stop else "done"
    return f"{r.evictions} of {r.planned} planned evictions carried out; {tail}"


def _load(path: str) -> Plan:
    try:
        return Plan.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        rule = f"must be the output of `gpupack repack --plan --json` ({exc})"
        raise InputError([FieldError("--from", path, rule)]) from None


def run(args: argparse.Namespace) -> int:
    if (args.dry_run or args.from_file) and not args.apply:
        flag = "--dry-run" if args.dry_run else "--from"
        print(f"gpupack repack: {flag} only makes sense with --apply", file=sys.stderr)
        return 2
    if args.for_pod and args.from_file:
        print("gpupack repack: --for plans anew; --from carries out a saved plan: give one", file=sys.stderr)
        return 2
    try:
        saved = _load(args.from_file) if args.from_file else None
        kube = Kube.connect(args.kubeconfig)
        shown = ""
        extra: dict[str, Any] = {}
        if saved is not None:
            the_plan = saved
        elif args.for_pod:
            snap = snapshot.read(kube, with_pdbs=True)
            room = compute_room(
                snap,
                snap.cache(args.heartbeat_timeout),
                args.for_pod,
                policy=args.policy,
                max_moves=DEFAULT_MAX_MOVES if args.max_evictions is None else args.max_evictions,
                namespace=args.namespace,
            )
            the_plan = room.plan
            shown = render_room(args.for_pod, room)
            extra = {"for": args.for_pod, "room": {"node": room.node, "gpus": list(room.gpus)}}
        else:
            snap = snapshot.read(kube, with_pdbs=True)
            the_plan = compute(
                snap,
                snap.cache(args.heartbeat_timeout),
                goal=Goal(args.goal),
                policy=args.policy,
                max_evictions=args.max_evictions,
                namespace=args.namespace,
            )
        shown = shown or render_plan(the_plan)
        doc = {**the_plan.to_dict(), **extra}
        if not args.apply:
            print(json.dumps(doc, indent=2) if args.json else shown)
            return 0
        if not args.json:
            print(shown + "\n")
        executor = Executor(
            kube,
            timeout_s=args.timeout,
            on_step=lambda s: None if args.json else print(render_step(s), flush=True),
        )
        report = executor.run(the_plan, max_evictions=args.max_evictions, dry_run=args.dry_run)
    except (KubeError, ValueError) as exc:
        print(f"gpupack repack: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"plan": doc, "report": report.to_dict()}, indent=2))
    else:
        print(render_report(report))
    return EXIT_STOPPED if report.stopped else 0
