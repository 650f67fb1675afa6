"""Reading the openb trace CSVs into model values, with errors that point at the offending cell."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from app.core import catalog, request
from app.core.errors import FieldError, InputError
from app.core.model import MILLI_PER_GPU, Demand, Gpu, Node

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")  # gpu_spec is optional


class TraceError(InputError):
    """A trace file that cannot be read: the field (a cell's column, the header, a row) with its value and
    rule, where = the file and line."""

    def __init__(self, where: str, field: str, value: object, rule: str) -> None:
        super().__init__([FieldError(field, value, rule)], where)


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    demand: Demand

    @property
    def gpu_milli(self) -> int:
        """Total GPU compute the pod asks for (milli per device x devices)."""
        return (self.demand.milli or 0) * self.demand.count


def load_nodes(path: Path) -> tuple[Node, ...]:
    with _open(path) as f:
        return read_nodes(f, str(path))


def load_pods(path: Path) -> tuple[TracePod, ...]:
    with _open(path) as f:
        return read_pods(f, str(path))


def _open(path: Path) -> TextIO:
    try:
        return path.open(newline="", encoding="utf-8")
    except OSError as e:
        raise TraceError("", "file", str(path), f"must be readable ({e.strerror or e})") from None


def read_nodes(f: TextIO, source: str) -> tuple[Node, ...]:
    nodes: list[Node] = []
    seen: set[str] = set()
    for line, row in _rows(f, source, NODE_COLUMNS):
        cell = _Cells(source, line, row)
        name = cell.text("sn")
        if name in seen:
            raise cell.error("sn", "must be unique")
        seen.add(name)
        count = cell.integer("gpu", 0, 64)
        model = row.get("model") or ""
        gpus: tuple[Gpu, ...] = ()
        if count:
            try:
                known = catalog.lookup(model)
            except KeyError:
                raise cell.error(
                    "model", f"must be a known GPU model ({', '.join(sorted(catalog.models()))})"
                ) from None
            gpus = tuple(Gpu(index=i, model=known.name, memory_mib=known.memory_mib) for i in range(count))
        nodes.append(
            Node(
                name=name,
                gpus=gpus,
                cpu_milli_free=cell.integer("cpu_milli", 0, 1 << 40),
                memory_mib_free=cell.integer("memory_mib", 0, 1 << 50),
            )
        )
    if not nodes:
        raise TraceError(source, "rows", 0, "must list at least one node")
    return tuple(nodes)


def read_pods(f: TextIO, source: str) -> tuple[TracePod, ...]:
    pods: list[TracePod] = []
    for line, row in _rows(f, source, POD_COLUMNS):
        cell = _Cells(source, line, row)
        count = cell.integer("num_gpu", 0, 64)
        milli = cell.integer("gpu_milli", 0, MILLI_PER_GPU)
        if count and not milli:
            raise cell.error("gpu_milli", "must be in [1, 1000] when num_gpu > 0")
        # Models canonicalised as the webhook and extender read gpupack.io/gpu-model (app.core.request).
        models = frozenset(request.gpu_models(row.get("gpu_spec") or None))
        demand = Demand(
            count=count,
            milli=milli if count else None,
            models=models if count else frozenset(),
            cpu_milli=cell.integer("cpu_milli", 0, 1 << 40),
            host_memory_mib=cell.integer("memory_mib", 0, 1 << 50),
        )
        pods.append(TracePod(cell.text("name"), demand))
    if not pods:
        raise TraceError(source, "rows", 0, "must list at least one pod")
    return tuple(pods)


def _rows(f: TextIO, source: str, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(f)
    header = reader.fieldnames or []
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(
            f"{source}:1", "header", ",".join(header), f"must have the column(s) {', '.join(missing)}"
        )
    try:
        for row in reader:
            if None in row or any(row.get(c) is None for c in required):
                cells = [v for k, v in row.items() if k is not None and v is not None] + list(
                    row.get(None) or []
                )
                rule = f"must have {len(header)} columns, as the header does"
                raise TraceError(f"{source}:{reader.line_num}", "row", ",".join(cells), rule)
            yield reader.line_num, row
    except csv.Error as e:
        raise TraceError(f"{source}:{reader.line_num}", "row", str(e), "must be well-formed CSV") from None


class _Cells:
    def __init__(self, source: str, line: int, row: dict[str, str]):
        self.source, self.line, self.row = source, line, row

    def error(self, column: str, rule: str) -> TraceError:
        return TraceError(f"{self.source}:{self.line}", f"column {column}", self.row.get(column, ""), rule)

    def text(self, column: str) -> str:
        value = self.row[column].strip()
        if not value:
            raise self.error(column, "must not be empty")
        return value

    def integer(self, column: str, lo: int, hi: int) -> int:
        raw = self.row[column].strip()
        if not (raw.isascii() and raw.isdigit()) or not lo <= int(raw) <= hi:
            raise self.error(column, f"must be an integer in [{lo}, {hi}]")
        return int(raw)
