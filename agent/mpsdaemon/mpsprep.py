"""Put the node's MPS GPUs in their compute mode, only while idle, and record that the node is ready for MPS.

Run by the MPS daemon pod's init container (`gpupack agent prepare-mps`) before the daemon starts, so after
a reboot or driver reload (which put every GPU back to DEFAULT) the modes are back before the daemon
serves anyone; and by the agent each cycle, which switches a GPU whose mode is wrong once it is idle.

The ready record (`<pipe dir>/gpupack-mps-ready`, JSON) carries the boot id it was written under and each
GPU's mode. A record from an earlier boot, or none, means "not ready on this boot": the node-side step
that starts GPU containers reads it with `not_ready()` and fails such a container closed with that reason
(docs/upgrades.md, "After a reboot").
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.nvml.base import ComputeMode, Nvml, NvmlError

READY_FILE = "gpupack-mps-ready"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True, slots=True)
class GpuMode:
    index: int
    uuid: str
    mode: ComputeMode | None  # None: NVML could not tell
    switched: bool = False
    reason: str = ""  # why it is not in the wanted mode ("" when it is)


def apply(nvml: Nvml, mps_mode: ComputeMode | None, time_slice: Collection[int] = ()) -> list[GpuMode]:
    """Every whole (non-MIG) GPU in mode `mps_mode`, those of `time_slice` (indexes) in DEFAULT, switching
    only GPUs with no compute process on them; None: switch nothing, only read each GPU's mode (for the
    ready record)."""
    out: list[GpuMode] = []
    for index in range(nvml.device_count()):
        want = mps_mode if mps_mode is None or index not in time_slice else ComputeMode.DEFAULT
        try:
            uuid = nvml.uuid(index)
        except NvmlError as exc:
            out.append(GpuMode(index, "", None, reason=str(exc)))
            continue
        try:
            if _mig_enabled(nvml, index):
                out.append(GpuMode(index, uuid, None, reason="MIG enabled: not shared through MPS"))
                continue
            mode = nvml.compute_mode(index)
            if want is None or mode is want:
                out.append(GpuMode(index, uuid, mode))
                continue
            busy = nvml.processes(index)
            if busy:
                reason = f"busy ({len(busy)} processes): switched to {want.value} once idle"
                out.append(GpuMode(index, uuid, mode, reason=reason))
                continue
            nvml.set_compute_mode(index, want)
            out.append(GpuMode(index, uuid, want, switched=True))
        except NvmlError as exc:
            out.append(GpuMode(index, uuid, None, reason=str(exc)))
    return out


def _mig_enabled(nvml: Nvml, index: int) -> bool:
    try:
        return nvml.mig_enabled(index)
    except NvmlError:  # NOT_SUPPORTED: a GPU without MIG
        return False


def boot_id(path: Path = BOOT_ID) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def write_ready(pipe_dir: Path, modes: list[GpuMode], boot: str) -> Path:
    """The ready record, replaced atomically (a reader never sees half of it)."""
    pipe_dir.mkdir(parents=True, exist_ok=True)
    doc = {"bootID": boot, "gpus": {m.uuid: m.mode.value if m.mode else "" for m in modes if m.uuid}}
    path = pipe_dir / READY_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def not_ready(pipe_dir: Path, uuids: list[str], want: ComputeMode | None, boot: str) -> str:
    """Why a GPU container using `uuids` through MPS must not start now ("" when it may); `want` None:
    any compute mode will do (agent.mps.exclusiveProcess off), only the record's boot counts."""
    path = pipe_dir / READY_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"the MPS daemon pod has not prepared this node ({path} missing or unreadable)"
    if not isinstance(doc, Mapping) or doc.get("bootID") != boot:
        return (
            f"the MPS daemon pod has not prepared this node since it booted ({path} is from an earlier boot)"
        )
    gpus = doc.get("gpus")
    if not isinstance(gpus, Mapping) or want is None:
        return ""
    wrong = [u for u in uuids if gpus.get(u) != want.value]
    if wrong:
        return f"GPU {', '.join(wrong)} not in {want.value} (see the mps-daemon pod's init log)"
    return ""


def readiness(pipe_dir: Path, boot: str) -> Callable[[Sequence[str]], str]:
    """The node side's check before an MPS client starts (agent.runtime.nodeside.decide's `mps_not_ready`).

    Only that the daemon pod prepared the node on this boot, whatever each GPU's mode: a GPU that was busy
    then is still in DEFAULT, an MPS client works there, and the agent switches it once it is idle. Its
    mode is a placement fact (the GPUNode reports it "shared", with its weaker levels, so pods that need
    more are placed elsewhere), so a container placed on it is never refused for it here.
    """
    return lambda uuids: not_ready(pipe_dir, list(uuids), None, boot)
