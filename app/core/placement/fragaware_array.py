"""FragAware's array form: its filter and score on many nodes in one numpy pass, float for float (pure).

Declared for the FragAware type in the registry (in `arrayforms`; found by `Registry.array_form`): the
engine hands it a new demand shape's nodes, or a batch of changed ones. Per node arrays hold each GPU's
free milli, memory room and health; the fit mask, the "after" states (one per GPU for a share, the best-fit
GPUs for whole and multi-GPU demands) and `TargetWorkload.node_frag`'s sum over the workload's shapes are
array operations that add the same terms in the same order, so every float is the scalar path's. Only the
sigmoid's exp may differ by an ulp from `math.exp`: a node whose score lands next to an integer is scored
again the scalar way. Nodes the pass does not model (MIG devices, GPUs of mixed models or sizes, an
over-committed GPU, GPUs `fit.array_modelled` keeps out, such as a CLOSED one), demands with an
isolation need (`fit.mode_neutral`) and refusals other than a GPU share or memory
shortfall are left to the policy itself (None in the answer). What the pass reads of a node (`read`: its
GPUs' numbers and free CPU packed as int64 bytes, and its host fields) is kept by the engine per node
state, so later shapes skip reading the GPUs: a group's rows become one matrix by one join, and the
node-wide rule is asked once per distinct host fields. What no demand changes of a group's nodes (the
GPUs' numbers, the fragmentation and CPU stranding before a pod lands) is kept as a table for the next
pass over every node (the next new shape), which works out again only the rows of the nodes that changed
since; `prepare` builds it ahead of the first pass (the extender does at Ready). A share's one-GPU "after"
states are each the node's sorted free shares with one key lowered, so their stranding sums need no sort.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from itertools import chain
from operator import attrgetter, itemgetter
from struct import Struct

import numpy as np
import numpy.typing as npt

from app.core.errors import PlacementReason, Shortfall
from app.core.model import MILLI_PER_GPU, Demand, Node
from app.core.placement.base import Judged
from app.core.placement.fit import array_modelled, host_shortfall, mode_neutral
from app.core.placement.fragaware import FragAware, score_of

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
# A sigmoid value this close to an integer may truncate differently with math.exp: score it again.
_NEAR_INTEGER = 1e-9
_NOT_FITTING = 2 * MILLI_PER_GPU  # sorts after every free share

Group = tuple[int, str, int]  # GPUs, model, memory of each GPU
# What `fit.host_shortfall` reads of a node: schedulable, CPU and memory free (None: not tracked), MPS.
Host = tuple[bool, int | None, int | None, bool]
# A node's group, its host fields, and its GPUs' (milli used, healthy, memory used, foreign memory) one
# after another then its free CPU and whether that is known, packed as int64s: a group's rows are joined
# and read as one matrix without a Python int per value.
Row = tuple[Group, Host, bytes]
_PER_GPU = 4  # int64s per GPU in a row


class FragAwareArray:
    """`FragAware`'s filter and score for whole-GPU shares, in array passes (see the module docstring)."""

    def __init__(self, policy: FragAware) -> None:
        self.policy = policy
        self._terms: dict[str, _Terms] = {}
        # Per group: the node-state arrays of the rows the last pass over every node judged, for the next
        # (the next new shape) to read only the rows of nodes that changed since.
        self._kept: dict[Group, _Table] = {}

    def covers(self, demand: Demand) -> bool:
        return (
            demand.count > 0
            and not demand.mig
            and not demand.mig_profile
            and (demand.milli is not None or demand.memory_mib is not None)
            and mode_neutral(demand)
        )

    def read(self, node: Node) -> Row | None:
        """None unless every GPU is one the arrays model (`fit.array_modelled`: whole GPUs, for now) and
        all are of one model and size (MIG devices, mixes, GPUs under other rules: the policy's)."""
        gpus = node.gpus
        kinds = set(map(_kind, gpus))
        if len(kinds) != 1 or not all(map(array_modelled, gpus)):
            return None  # no GPUs, GPUs of several models or sizes, or a GPU under a rule arrays skip
        _, model, memory_mib = kinds.pop()
        cpu = node.cpu_milli_free
        host = (node.schedulable, cpu, node.memory_mib_free, node.mps)
        packed = _packer(len(gpus)).pack(
            *chain.from_iterable(map(_usage, gpus)), 0 if cpu is None else cpu, cpu is not None
        )
        return (len(gpus), model, memory_mib), host, packed

    def judge(
        self, nodes: Sequence[Node], reads: Sequence[Row | None], demand: Demand
    ) -> list[Judged | None]:
        """Per node: the refusal `policy.filter` gives, else `policy.score`; None where the policy must."""
        out: list[Judged | None] = [None] * len(nodes)
        if not self.covers(demand):
            return out
        for group, (idx, rows) in _groups(reads).items():
            table = self._table(group, rows)
            # The node-wide rule is fit.py's own, asked once per distinct host fields.
            host_fits = {host: host_shortfall(*host, demand) is None for host in set(table.hosts)}
            host_ok = np.fromiter(map(host_fits.__getitem__, table.hosts), dtype=np.bool_, count=len(idx))
            _Pass(self.policy, demand, table, host_ok).fill(out, nodes, idx)
        return out

    def prepare(self, reads: Sequence[Row | None]) -> None:
        for group, (_, rows) in _groups(reads).items():
            self._table(group, rows)

    def _table(self, group: Group, rows: Sequence[Row]) -> _Table:
        """The node-state arrays of `rows`: the last pass's table where its rows are these, else built from
        its rows that are still here and the new ones read from scratch."""
        kept = self._kept.get(group)
        if kept is not None and kept.rows == rows:
            return kept
        table = _Table.of(self.terms(group[1]), group, rows, kept)
        if kept is None or 2 * len(rows) >= len(kept.rows):  # a catch-up's few changed nodes: not kept
            self._kept[group] = table
        return table

    def terms(self, model: str) -> _Terms:
        terms = self._terms.get(model)
        if terms is None:
            terms = self._terms[model] = _Terms(self.policy, model)
        return terms


def _groups(reads: Sequence[Row | None]) -> dict[Group, tuple[list[int], Sequence[Row]]]:
    """Each group's positions among `reads` and its rows (one group is the rule: C-level maps then)."""
    kinds = [None if row is None else row[0] for row in reads]
    distinct = set(kinds)
    if len(distinct) == 1 and None not in distinct:
        return {distinct.pop(): (list(range(len(reads))), reads)}  # type: ignore[dict-item]  # no None
    out: dict[Group, tuple[list[int], list[Row]]] = {}
    for i, (kind, row) in enumerate(zip(kinds, reads, strict=True)):
        if kind is not None and row is not None:
            idx, rows = out.setdefault(kind, ([], []))
            idx.append(i)
            rows.append(row)
    return out  # type: ignore[return-value]  # lists are sequences


_kind = attrgetter("mig_profile", "model", "memory_mib")
_usage = attrgetter("milli_used", "healthy", "memory_used_mib", "foreign_mib")


@cache
def _packer(gpus: int) -> Struct:
    """A row's int64s for a node of `gpus` GPUs (native order: read back by numpy on this machine)."""
    return Struct(f"={_PER_GPU * gpus + 2}q")


class _Terms:
    """`TargetWorkload.node_frag`'s and `cpu_stranded`'s pieces for nodes of one model, as array steps."""

    def __init__(self, policy: FragAware, model: str) -> None:
        workload = policy.workload
        self.margin_mib = policy.margin_mib
        self.strand = policy.options.strand_weight
        self.plan = workload.plan(model)
        # The shares the workload's shapes ask, where node_frag splits a node's free shares.
        shares = sorted({milli for _, milli, count, _ in self.plan if count})
        self.thresholds: Ints = np.array(shares, dtype=np.int64)
        self.threshold_index = {milli: i for i, milli in enumerate(shares)}
        self.settled: Floats = np.asarray(workload.settled_for(model), dtype=np.float64)
        # x - V[x] per free share x, and 0.0 at index -1 for GPUs left out (adding 0.0 changes no sum).
        self.usable_of: Floats = np.append(np.arange(len(self.settled)) - self.settled, 0.0)
        self.cpu_per_milli = workload.cpu_per_milli_for(model)

    def below(self, lefts: Ints) -> tuple[Floats, Ints, Bools, Floats]:
        """Per threshold (a shape's share) and row: the free shares below it summed, how many GPUs have
        at least it, which GPUs are below it and their free shares (0 for the others), thresholds first.
        Sums of integers: exact as floats, in any order (summed a GPU column at a time: numpy reduces a
        short last axis slowly)."""
        below = lefts < self.thresholds[:, None, None]
        below_lefts: Floats = np.where(below, lefts.astype(np.float64), 0.0)
        small: Floats = below_lefts[:, :, 0].copy()
        at_least: Ints = (~below[:, :, 0]).astype(np.int64)
        for k in range(1, lefts.shape[1]):
            small += below_lefts[:, :, k]
            at_least += ~below[:, :, k]
        return small, at_least, below, below_lefts

    def cpu_ok(self, cpu: Ints, known: Bools) -> dict[int, Bools]:
        """Per CPU request of the workload's shapes: whether each node has that much CPU free."""
        return {c: ~known | (cpu >= c) for _, _, count, c in self.plan if count}

    def accumulate(
        self, small: Floats, at_least: Ints, total: Ints | Floats, cpu_ok: dict[int, Bools]
    ) -> Floats:
        """`node_frag` per element from `below`'s sums and `cpu_ok`'s answers."""
        frag = np.zeros(small.shape[1:], dtype=np.float64)
        term = np.empty_like(frag)
        # A shape's frag term before its weight: the free shares below its share where enough GPUs have
        # it and the host its CPU, else all free shares. Shapes of one share and count (many ask a whole
        # GPU) share the first part; a CPU request every node meets adds nothing to it.
        by_share: dict[tuple[int, int], Floats] = {}
        # Shape order and one multiply-add per shape, as node_frag: the same float in every element
        # (into reused arrays: they are large, and x * w == w * x).
        for weight, milli, count, shape_cpu in self.plan:
            if count:
                t = self.threshold_index[milli]
                unweighted = by_share.get((t, count))
                if unweighted is None:
                    unweighted = by_share[t, count] = np.where(at_least[t] >= count, small[t], total)
                ok = cpu_ok[shape_cpu]
                if not ok.all():
                    unweighted = np.where(ok, unweighted, total)
                np.multiply(unweighted, weight, out=term)
                frag += term
            else:
                frag += weight * total
        return frag

    def stranded(self, lefts: Ints, healthy: Bools, cpu: Ints, known: Bools) -> Floats:
        """`TargetWorkload.cpu_stranded` per row: free shares summed in ascending order, as the scalar sum."""
        ratio = self.cpu_per_milli
        if ratio is None:
            return np.zeros(len(lefts), dtype=np.float64)
        keyed = np.sort(np.where(healthy, np.clip(lefts, 0, MILLI_PER_GPU), -1), axis=1)
        terms = self.usable_of[keyed].T.copy()  # one contiguous row per position in the ascending order
        usable = terms[0]
        for term in terms[1:]:
            usable = usable + term
        stranded = np.maximum(0.0, usable - cpu / ratio)
        return np.where(known, stranded, 0.0)

    def stranded_per_gpu(self, lefts: Ints, healthy: Bools, cpu: Ints, known: Bools, milli: int) -> Floats:
        """`stranded` of each one-GPU "after" state (row n, GPU j: GPU j's free share less `milli`),
        without sorting each after state: it is the sorted row with one key lowered, so the key moves
        left from its place p to the first place q whose key is not below it, and the keys between shift
        right by one. The terms are then summed in ascending order, as `stranded` sums them."""
        ratio = self.cpu_per_milli
        if ratio is None:
            return np.zeros(lefts.shape, dtype=np.float64)
        keys = np.where(healthy, np.clip(lefts, 0, MILLI_PER_GPU), -1)
        lowered = np.where(healthy, np.clip(lefts - milli, 0, MILLI_PER_GPU), -1)
        ordered = np.sort(keys, axis=1)
        # GPU j's key sits at the last place holding its value (equal keys are equal terms); the lowered
        # key goes to the first place whose key is not below it (q <= p: it is not above the old key).
        # Counted a column at a time: numpy reduces a short last axis slowly.
        gpus = keys.shape[1]
        p = np.full(keys.shape, -1, dtype=np.int64)
        q = np.zeros(keys.shape, dtype=np.int64)
        for k in range(gpus):
            col = ordered[:, k, None]
            p += col <= keys
            q += col < lowered
        usable_of = self.usable_of
        usable: Floats | None = None
        for k in range(gpus):
            col = ordered[:, k, None]
            shifted = ordered[:, k - 1, None] if k else col
            key = np.where((q > k) | (p < k), col, np.where(q == k, lowered, shifted))
            term = usable_of[key]
            usable = term if usable is None else usable + term
        assert usable is not None  # a group's nodes have GPUs
        stranded = np.maximum(0.0, usable - cpu[:, None] / ratio)
        return np.where(known[:, None], stranded, 0.0)


# A table's arrays with their row axis, for `_Table.update`.
_ROW_AXIS = {"free": 0, "healthy": 0, "room": 0, "foreign": 0, "cpu": 0, "cpu_known": 0, "in_range": 0,
             "lefts": 0, "total": 0, "before": 0, "stranded_before": 0,
             "small": 1, "at_least": 1, "below": 1, "below_lefts": 1}  # fmt: skip


@dataclass(slots=True)
class _Table:
    """What every pass reads of one group's rows, whatever the demand: the GPUs' numbers and the
    fragmentation and stranding before any pod is added. Kept by the array form for the next pass over
    the same nodes (the next new shape), which reads only the rows of the nodes that changed since."""

    rows: list[Row]
    hosts: list[Host]
    model: str
    memory_mib: int
    terms: _Terms
    free: Ints
    healthy: Bools
    room: Ints  # memory_room: total - reserved - foreign, less the margin where foreign processes run
    foreign: Bools
    cpu: Ints
    cpu_known: Bools
    in_range: Bools  # every GPU's reservations within its capacity (else the policy judges the node)
    lefts: Ints  # each GPU's free share, 0 for an unhealthy GPU (it adds nothing to any frag sum)
    total: Ints
    small: Floats
    at_least: Ints
    below: Bools
    below_lefts: Floats
    before: Floats  # node_frag now
    stranded_before: Floats  # cpu_stranded now (zeros where the policy does not weigh it)

    @classmethod
    def of(cls, terms: _Terms, group: Group, rows: Sequence[Row], kept: _Table | None) -> _Table:
        """The table of `rows`: `kept` brought up to them where they are its rows, in its order, but for
        a few (the nodes that took or gave back pods since), else read anew."""
        if kept is None or len(kept.rows) != len(rows):
            return cls.read(terms, group, rows)
        changed = [j for j, (old, new) in enumerate(zip(kept.rows, rows, strict=True)) if old is not new]
        if 2 * len(changed) > len(rows):
            return cls.read(terms, group, rows)
        if changed:
            kept.update(changed, cls.read(terms, group, [rows[j] for j in changed]))
        return kept

    @classmethod
    def read(cls, terms: _Terms, group: Group, rows: Sequence[Row]) -> _Table:
        _, model, memory_mib = group
        n = len(rows)
        matrix = np.frombuffer(b"".join(map(_packed, rows)), dtype=np.int64).reshape(n, -1)
        gpus = matrix[:, :-2].reshape(n, -1, _PER_GPU)
        free: Ints = MILLI_PER_GPU - gpus[:, :, 0]
        healthy: Bools = gpus[:, :, 1] != 0
        foreign_mib = gpus[:, :, 3]
        foreign: Bools = foreign_mib > 0
        room: Ints = memory_mib - gpus[:, :, 2] - foreign_mib - np.where(foreign, terms.margin_mib, 0)
        cpu: Ints = matrix[:, -2].copy()
        cpu_known: Bools = matrix[:, -1] != 0
        lefts: Ints = np.where(healthy, free, 0)
        small, at_least, below, below_lefts = terms.below(lefts)
        total: Ints = lefts.sum(axis=1)
        return cls(
            rows=list(rows),
            hosts=list(map(_host, rows)),
            model=model,
            memory_mib=memory_mib,
            terms=terms,
            free=free,
            healthy=healthy,
            room=room,
            foreign=foreign,
            cpu=cpu,
            cpu_known=cpu_known,
            in_range=np.asarray(((free >= 0) & (free <= MILLI_PER_GPU)).all(axis=1), dtype=np.bool_),
            lefts=lefts,
            total=total,
            small=small,
            at_least=at_least,
            below=below,
            below_lefts=below_lefts,
            before=terms.accumulate(small, at_least, total, terms.cpu_ok(cpu, cpu_known)),
            stranded_before=terms.stranded(lefts, healthy, cpu, cpu_known) if terms.strand else np.zeros(n),
        )

    def update(self, at: list[int], fresh: _Table) -> None:
        """Rows `at` are now `fresh`'s rows, in order (in place: a pass is over before the next begins)."""
        for name, axis in _ROW_AXIS.items():
            getattr(self, name)[(slice(None),) * axis + (at,)] = getattr(fresh, name)
        for j, row, host in zip(at, fresh.rows, fresh.hosts, strict=True):
            self.rows[j], self.hosts[j] = row, host


_host = itemgetter(1)
_packed = itemgetter(2)


class _Pass:
    """One group of nodes (same GPU count, model and memory) judged together for one demand."""

    def __init__(self, policy: FragAware, demand: Demand, table: _Table, host_ok: Bools) -> None:
        self.policy, self.demand, self.table = policy, demand, table
        self.model = table.model
        self.milli, self.mib = demand.on(table.memory_mib)
        # An over-committed GPU (reservations past its capacity) is the policy's to judge.
        self.host_ok = host_ok & table.in_range
        self.share_ok: Bools = table.healthy & (self.milli <= table.free)
        self.gpu_fit: Bools = self.share_ok & (self.mib <= table.room) & demand.accepts(self.model)
        self.fits: Bools = self.host_ok & (self.gpu_fit.sum(axis=1) >= demand.count)

    def fill(self, out: list[Judged | None], nodes: Sequence[Node], idx: list[int]) -> None:
        """Each node's answer into `out`, at `idx` (the group's positions among `nodes`)."""
        fitting = np.flatnonzero(self.fits)
        if len(fitting):
            for k, s in zip(fitting.tolist(), self._scores(fitting).tolist(), strict=True):
                out[idx[k]] = s
        if self.demand.accepts(self.model):
            refused = np.flatnonzero(~self.fits & self.host_ok & self.table.healthy.any(axis=1)).tolist()
            names = [nodes[idx[k]].name for k in refused]
            for k, reason in zip(refused, self._shortfalls(refused, names), strict=True):
                out[idx[k]] = reason

    # --- refusals ---

    def _shortfalls(self, refused: list[int], names: list[str]) -> list[PlacementReason | None]:
        """`_gpu_shortfall`'s share or memory refusal per node of `refused` (host checks passed, a healthy
        GPU); None where the refusal names foreign processes: the policy builds that one."""
        count, table = self.demand.count, self.table
        healthy, share_ok = table.healthy[refused], self.share_ok[refused]
        room = table.room[refused]
        passing = share_ok.sum(axis=1).tolist()
        best_free = np.where(healthy, table.free[refused], -MILLI_PER_GPU).max(axis=1).tolist()
        foreign = np.any(table.foreign[refused] & share_ok, axis=1).tolist()
        best_room = np.where(share_ok, room, np.iinfo(np.int64).min).max(axis=1).tolist()
        fit = (share_ok & (room >= self.mib)).sum(axis=1).tolist()
        out: list[PlacementReason | None] = []
        for j, name in enumerate(names):
            if passing[j] < count:
                out.append(
                    PlacementReason(
                        name, None, Shortfall.GPU_SHARE, self.milli, best_free[j], count, passing[j]
                    )
                )
            elif foreign[j]:
                out.append(None)
            else:
                out.append(
                    PlacementReason(name, None, Shortfall.GPU_MEMORY, self.mib, best_room[j], count, fit[j])
                )
        return out

    # --- scores ---

    def _scores(self, fitting: Ints) -> Floats:
        """FragAware's score per node of `fitting` (nodes that fit)."""
        options, demand, table, terms = self.policy.options, self.demand, self.table, self.table.terms
        # The fitting rows of the table (all of them: no copies).
        rows: Ints | slice = slice(None) if len(fitting) == len(self.fits) else fitting
        free, healthy, fit = table.free[rows], table.healthy[rows], self.gpu_fit[rows]
        cpu, known, lefts = table.cpu[rows], table.cpu_known[rows], table.lefts[rows]
        before, total = table.before[rows], table.total[rows]
        cpu_after = cpu - demand.cpu_milli
        strand = options.strand_weight
        if demand.count == 1 and not demand.is_whole:
            # One "after" state per GPU: that GPU's free share less the demand. The sums below each
            # shape's share move by that one GPU's terms, so no after state is summed from scratch.
            small, at_least = table.small[:, rows], table.at_least[:, rows]
            below, below_lefts = table.below[:, rows], table.below_lefts[:, rows]
            taken = lefts - self.milli
            taken_below = taken < terms.thresholds[:, None, None]
            after_small = small[:, :, None] - below_lefts
            after_small += taken_below * taken.astype(np.float64)
            after_at_least = at_least[:, :, None] + below - taken_below
            cpu_ok = {c: ok[:, None] for c, ok in terms.cpu_ok(cpu_after, known).items()}
            frag_after = terms.accumulate(after_small, after_at_least, (total - self.milli)[:, None], cpu_ok)
            delta = before[:, None] - frag_after
            if strand:
                stranded_after = terms.stranded_per_gpu(lefts, healthy, cpu_after, known, self.milli)
                delta = delta + strand * (table.stranded_before[rows][:, None] - stranded_after)
            else:
                delta = delta + 0.0
            if options.settle_weight:
                settled = terms.settled
                rest = np.clip(free - self.milli, 0, MILLI_PER_GPU)  # GPUs that do not fit are masked
                delta = delta + options.settle_weight * (settled[free] - settled[rest])
            scarce = self.policy.scarce(self.model, demand)
            if scarce:
                delta = delta - scarce * self.milli
            scores = self._sigmoid(delta)
            best: Floats = np.where(fit, scores, -1.0).max(axis=1)
            return best
        # Whole and multi-GPU: the best-fit GPUs (least free first) each lose the demand's share.
        order = np.argsort(np.where(fit, free, _NOT_FITTING), axis=1, kind="stable")
        after = lefts.copy()
        after[np.arange(len(after))[:, None], order[:, : demand.count]] -= self.milli
        after_small, after_at_least, _, _ = terms.below(after)
        cpu_ok_after = terms.cpu_ok(cpu_after, known)
        delta = before - terms.accumulate(after_small, after_at_least, after.sum(axis=1), cpu_ok_after)
        if strand:
            stranded_after = terms.stranded(after, healthy, cpu_after, known)
            delta = delta + strand * (table.stranded_before[rows] - stranded_after)
        else:
            delta = delta + 0.0
        scarce = self.policy.scarce(self.model, demand)
        if scarce:
            delta = delta - scarce * (self.milli * demand.count)
        return self._sigmoid(delta)

    def _sigmoid(self, delta: Floats) -> Floats:
        """`score_of` per element; values next to an integer are computed again with math.exp."""
        value = 100.0 / (1.0 + np.exp(-delta / MILLI_PER_GPU))
        out = np.floor(value)
        near = np.flatnonzero(((value - out) < _NEAR_INTEGER) | ((out + 1.0 - value) < _NEAR_INTEGER))
        flat_out, flat_delta = out.reshape(-1), delta.reshape(-1)
        for i in near.tolist():
            flat_out[i] = score_of(float(flat_delta[i]))
        return out
