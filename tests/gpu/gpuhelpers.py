"""Pure helpers of the GPU suite: nvidia-smi parsing, inventory comparison, the env a pod gets, the report.

Nothing here touches a GPU, so CI exercises it (tests/gpu/test_gpu_helpers.py) even where the suite skips.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.nvml.base import Nvml, NvmlCode, NvmlError
from agent.simgpu.simfile import SimSet
from app.core import names, podview
from app.core.model import Allocation
from app.core.request import GpuRequest, parse

# The nvidia-smi query the inventory is checked against (field names from `nvidia-smi --help-query-gpu`).
SMI_FIELDS = ("index", "uuid", "name", "memory.total", "mig.mode.current", "compute_mode", "compute_cap")
SMI_ARGV = ("nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits")
_UUID_HEX = re.compile(r"[0-9a-fA-F]")


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """One GPU as an inventory source sees it; `mig` is None where the GPU has no MIG."""

    index: int
    uuid: str
    name: str
    memory_total_mib: int
    mig: bool | None
    compute_mode: str = ""  # "Default", "Exclusive_Process", "Prohibited" ("" where unknown)
    compute_cap: str = ""  # "9.0"


def parse_smi(text: str) -> list[GpuFacts]:
    """GPUs from `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits` output."""
    out: list[GpuFacts] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(SMI_FIELDS):
            raise ValueError(f"nvidia-smi line {n}: {line!r} has {len(cells)} fields, want {len(SMI_FIELDS)}")
        index, uuid, name, total, mig, mode, cap = cells
        if not (index.isdigit() and total.isdigit()):
            raise ValueError(
                f"nvidia-smi line {n}: index {index!r} and memory.total {total!r} must be integers"
            )
        out.append(
            GpuFacts(
                index=int(index),
                uuid=uuid,
                name=name,
                memory_total_mib=int(total),
                mig={"Enabled": True, "Disabled": False}.get(mig),
                compute_mode=mode,
                compute_cap="" if cap.startswith("[") else cap,
            )
        )
    return out


def inventory(nvml: Nvml) -> list[GpuFacts]:
    """What our NVML backend says about every GPU (the fields nvidia-smi can confirm)."""
    out: list[GpuFacts] = []
    for i in range(nvml.device_count()):
        try:
            mig: bool | None = nvml.mig_enabled(i)
        except NvmlError as exc:
            if exc.code is not NvmlCode.NOT_SUPPORTED:
                raise
            mig = None
        out.append(GpuFacts(i, nvml.uuid(i), nvml.name(i), nvml.memory(i).total_mib, mig))
    return out


def sim_reference(s: SimSet) -> list[GpuFacts]:
    """The simulated set's own answer, standing in for nvidia-smi where no GPU exists."""
    return [
        GpuFacts(i, g.uuid, g.product_name, g.memory_mib, g.mig_enabled if g.mig_slots else None)
        for i, g in enumerate(s.gpus)
    ]


def inventory_mismatches(ours: Sequence[GpuFacts], reference: Sequence[GpuFacts]) -> list[str]:
    """Every difference in index, UUID, name, total memory and MIG mode, as readable lines."""
    if len(ours) != len(reference):
        return [f"GPU count: backend {len(ours)}, reference {len(reference)}"]
    out: list[str] = []
    for a, b in zip(ours, reference, strict=True):
        for attr in ("index", "uuid", "name", "memory_total_mib", "mig"):
            va, vb = getattr(a, attr), getattr(b, attr)
            if va != vb:
                out.append(f"GPU {b.index} {attr}: backend {va!r}, reference {vb!r}")
    return out


def mps_capable(facts: GpuFacts, control_binary: str | None) -> tuple[bool, str]:
    """Whether MPS can run on this GPU, with the reason when it cannot.

    Pinned-memory and thread-percentage limits need Volta (compute capability 7.0) or newer; a
    Prohibited compute mode refuses every context; MIG-enabled GPUs run MPS per MIG device only.
    """
    if control_binary is None:
        return False, "nvidia-cuda-mps-control is not on PATH"
    if facts.compute_mode == "Prohibited":
        return False, "compute mode is Prohibited"
    if facts.mig:
        return False, "MIG is enabled (MPS would run per MIG device)"
    major = facts.compute_cap.split(".", 1)[0]
    if major.isdigit() and int(major) < 7:
        return False, f"compute capability {facts.compute_cap} is older than Volta (7.0)"
    return True, ""


def normalize_uuid(raw: str) -> str:
    """ "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" from NVML's, torch's or CuPy's spelling of a GPU UUID."""
    digits = "".join(_UUID_HEX.findall(raw.removeprefix("GPU-"))).lower()
    if len(digits) != 32:
        raise ValueError(f"GPU UUID {raw!r} must carry 32 hex digits, has {len(digits)}")
    d = digits
    return f"GPU-{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:]}"


# --- the env the webhook gives a pod, resolved the way the kubelet resolves it ---


def fraction_request(fraction: str) -> GpuRequest:
    """The webhook's parse of a pod annotated `gpu-fraction: <fraction>` with one container."""
    return share_request({names.GPU_FRACTION: fraction})


def share_request(annotations: Mapping[str, str]) -> GpuRequest:
    """The webhook's parse of a pod with these annotations and one container."""
    pod = {
        "metadata": {"annotations": dict(annotations)},
        "spec": {"containers": [{"name": "main", "image": "workload"}]},
    }
    parsed = parse(podview.read(pod))
    if not isinstance(parsed, GpuRequest):
        raise ValueError("; ".join(str(e) for e in parsed))
    return parsed


def allocation(req: GpuRequest, node: str, index: int, uuid: str, gpu_memory_mib: int) -> Allocation:
    """The allocation the extender would write for `req` on one GPU."""
    milli, mib = req.demand().on(gpu_memory_mib)
    return Allocation(node=node, gpu_indexes=(index,), gpu_uuids=(uuid,), milli=milli, memory_mib=mib)


_FIELD = re.compile(r"^metadata\.annotations\['(?P<key>[^']+)'\]$")


def resolve_env(env: Sequence[Mapping[str, Any]], annotations: Mapping[str, str]) -> dict[str, str]:
    """Container env entries as the kubelet resolves them: annotation fieldRefs read the pod's annotations
    (a missing one resolves to ""), plain values are copied."""
    out: dict[str, str] = {}
    for e in env:
        if "value" in e:
            out[str(e["name"])] = str(e["value"])
            continue
        path = str(e["valueFrom"]["fieldRef"]["fieldPath"])
        m = _FIELD.match(path)
        if m is None:
            raise ValueError(f"env {e['name']}: fieldPath {path!r} is not an annotation reference")
        out[str(e["name"])] = annotations.get(m["key"], "")
    return out


def pod_env(env: Sequence[Mapping[str, Any]], alloc: Allocation, pipe_dir: Path) -> dict[str, str]:
    """The GPU container's env for `alloc`, with the MPS pipe path seen from the host (the hostPath mount)."""
    out = resolve_env(env, alloc.to_annotations())
    if names.ENV_MPS_PIPE_DIRECTORY in out:
        out[names.ENV_MPS_PIPE_DIRECTORY] = str(pipe_dir)
    return out


# --- the JSON report ---


def report_path(environ: Mapping[str, str]) -> Path | None:
    """$GPUPACK_GPU_REPORT, else $OUT/gpu-report.json, else None (CI writes no report)."""
    if environ.get("GPUPACK_GPU_REPORT"):
        return Path(environ["GPUPACK_GPU_REPORT"])
    if environ.get("OUT"):
        return Path(environ["OUT"]) / "gpu-report.json"
    return None


@dataclass
class Report:
    """What the suite found: environment, per-test outcomes, named facts/measurements, and the answers to
    the questions of gpuquestions.QUESTIONS (with the tests that answer each, to say why one was not)."""

    environment: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)
    answers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    askers: dict[str, list[str]] = field(default_factory=dict)  # question id -> test node ids

    def fact(self, key: str, value: Any) -> None:
        self.facts[key] = value

    def answer(self, qid: str, answer: str, **evidence: Any) -> None:
        """One answer to question `qid` (a test may answer several, a question may get several variants)."""
        self.answers.setdefault(qid, []).append({"answer": answer, **evidence})

    def answers_markdown(self, questions: Mapping[str, str]) -> str:
        """Every question with its answers, or why it has none (its tests' skip or failure text)."""
        lines = ["# GPU suite answers", ""]
        env = ", ".join(f"{k}: {v}" for k, v in sorted(self.environment.items()) if k != "gpus")
        lines += [f"Environment: {env}", ""]
        if self.environment.get("rehearsal"):
            lines += ["REHEARSAL: every answer below comes from stand-ins (tests/gpu/fakecuda).", ""]
        for qid, text in questions.items():
            lines.append(f"## {qid}\n\n{text}\n")
            for a in self.answers.get(qid, []):
                lines.append(f"- **{a['answer']}**")
                evidence = {k: v for k, v in a.items() if k != "answer"}
                if evidence:
                    lines.append(f"  `{json.dumps(evidence, sort_keys=True, default=str)[:1500]}`")
            for nodeid in self.askers.get(qid, []):
                t = self.tests.get(nodeid, {"outcome": "not run"})
                why = (
                    f": {str(t.get('detail', '')).strip().splitlines()[-1][:300]}" if t.get("detail") else ""
                )
                lines.append(f"- test `{nodeid.split('::', 1)[-1]}` {t['outcome']}{why}")
            if not self.answers.get(qid):
                lines.append("- not answered in this run")
            lines.append("")
        return "\n".join(lines)

    def outcome(self, nodeid: str, outcome: str, detail: str, duration_s: float) -> None:
        entry = self.tests.setdefault(nodeid, {"outcome": "passed", "duration_s": 0.0})
        # setup/call/teardown each report; keep the first non-pass (a skip or a failure says why).
        if entry["outcome"] == "passed" and outcome != "passed":
            entry["outcome"], entry["detail"] = outcome, detail[-2000:]
        entry["duration_s"] = round(float(entry["duration_s"]) + duration_s, 3)

    def summary(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tests.values():
            counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
        return counts

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "summary": self.summary(),
            "environment": self.environment,
            "facts": self.facts,
            "tests": self.tests,
            "answers": self.answers,
        }
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(body, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, path)
