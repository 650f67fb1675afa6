"""MPS control daemons for the GPU suite: started as the daemon pod starts one, under a private pipe dir.

`Daemon(..., flags=("-M",))` adds options (multi-user, `-p 3`, `-a <toml>`); `adopt=True` (the default) has
the agent's supervisor adopt it and set its defaults (MpsSupervisor.tick), as on a node. `control()` sends
one command from any pipe dir (a pod's own directory too) as any uid, the way a tenant's process could.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest
from gpuclients import wait_for
from gpuhelpers import allocation, pod_env, report_path, share_request

from agent.mpsdaemon.mps import Device, MpsConfig, MpsState, MpsSupervisor
from agent.nvml.base import Nvml
from app.core import names
from webhook.mutate import gpu_env


def mps_processes(pipe_dir: Path) -> list[tuple[int, str]]:
    """(pid, comm) of every nvidia-cuda-mps-* process whose environment names our pipe dir."""
    out: list[tuple[int, str]] = []
    marker = f"{names.ENV_MPS_PIPE_DIRECTORY}={pipe_dir}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            if comm.startswith("nvidia-cuda-mps") and marker in (entry / "environ").read_bytes():
                out.append((int(entry.name), comm))
        except OSError:  # gone, or not ours to read
            continue
    return out


def control(
    binary: str, pipe_dir: Path, command: str, uid: int | None = None, timeout_s: float = 20
) -> subprocess.CompletedProcess[str]:
    """One control command through `pipe_dir`/control, run as `uid` (None: as we are)."""
    argv = [binary]
    if uid is not None:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", binary]
    try:
        return subprocess.run(
            argv,
            input=command + "\n",
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=os.environ | {names.ENV_MPS_PIPE_DIRECTORY: str(pipe_dir)},
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(argv, -9, str(exc.stdout or ""), f"timed out after {timeout_s}s")


class Daemon:
    """One MPS control daemon under a private pipe dir (0755, so clients of other uids reach it).

    Every daemon launched is in `Daemon.launched` until stopped: the session quits any left (a test
    interrupted at the run's time budget must not leave a daemon holding the GPU)."""

    launched: ClassVar[set[Daemon]] = set()

    def __init__(
        self,
        nvml: Nvml,
        binary: str,
        pinned_default_mib: int | None = None,
        *,
        flags: Sequence[str] = (),
        adopt: bool = True,
        open_dirs: bool = False,
    ) -> None:
        self.index = 0
        self.uuid = nvml.uuid(self.index)
        self.memory_mib = nvml.memory(self.index).total_mib
        self.pipe_dir = Path(tempfile.mkdtemp(prefix="gpupack-mps-"))  # short: it holds a unix socket
        # open_dirs: pipe and log dirs writable by every uid (1777), so a per-uid server of another user can
        # make its files there; only for asking how uids share a daemon, not how a node runs it.
        self.dir_mode = 0o1777 if open_dirs else 0o755
        self.pipe_dir.chmod(self.dir_mode)
        self.flags, self.adopt = tuple(flags), adopt
        self.config = MpsConfig(
            binary=binary,
            pipe_dir=self.pipe_dir,
            default_pinned_mem_limit_mib=pinned_default_mib,
            command_timeout_s=20,
        )
        self.sup = MpsSupervisor(self.config)

    def launch(self) -> subprocess.CompletedProcess[str]:
        """`<binary> -d <flags>`: the daemon's own answer (it may refuse the flags)."""
        (self.pipe_dir / "log").mkdir(exist_ok=True)
        (self.pipe_dir / "log").chmod(self.dir_mode)
        Daemon.launched.add(self)
        env = os.environ | {
            names.ENV_MPS_PIPE_DIRECTORY: str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.pipe_dir / "log"),
            names.ENV_CUDA_VISIBLE_DEVICES: self.uuid,
        }
        return subprocess.run(
            [self.config.binary, "-d", *self.flags], env=env, stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=20, check=False,
        )  # fmt: skip

    def answers(self, timeout_s: float = 10) -> bool:
        """Whether the control socket answers `get_server_list` within `timeout_s` (`-d` forks first)."""
        return wait_for(lambda: self.control("get_server_list").returncode == 0, timeout_s, 0.2)

    def start(self) -> None:
        started = self.launch()
        assert started.returncode == 0, (
            f"{self.config.binary} -d {' '.join(self.flags)}: exit {started.returncode} "
            f"{started.stderr.strip()}\n{self.logs()}"
        )
        if not self.adopt:
            if not self.answers():
                logs = self.logs()
                self.control("quit")
                pytest.fail(f"MPS control daemon did not answer\n{logs}")
            return
        deadline = time.monotonic() + 10
        while True:
            status = self.sup.tick([Device(self.uuid, self.memory_mib)], now=time.monotonic())
            if self.sup.state is MpsState.RUNNING or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if self.sup.state is not MpsState.RUNNING:
            logs = self.logs()
            self.control("quit")  # a daemon that started but would not take its defaults
            pytest.fail(f"MPS did not start: {status.state}: {status.message}\n{logs}")

    def stop(self) -> float:
        """`quit`, as the daemon pod's deletion does; seconds until no daemon or server of ours is left."""
        t0 = time.monotonic()
        Daemon.launched.discard(self)
        self.control("quit")
        gone = wait_for(lambda: not mps_processes(self.pipe_dir), timeout_s=30)
        elapsed = time.monotonic() - t0
        self._keep_logs()
        assert gone, f"MPS processes left after quit: {mps_processes(self.pipe_dir)}"
        shutil.rmtree(self.pipe_dir, ignore_errors=True)
        return elapsed

    def _keep_logs(self) -> None:
        """Copy the daemon's control/server logs beside the report (they show the limits in effect)."""
        path = report_path(os.environ)
        if path is not None and (self.pipe_dir / "log").is_dir():
            shutil.copytree(
                self.pipe_dir / "log", path.parent / "mps-logs" / self.pipe_dir.name, dirs_exist_ok=True
            )

    def control(self, command: str, uid: int | None = None) -> subprocess.CompletedProcess[str]:
        return control(self.config.binary, self.pipe_dir, command, uid)

    def logs(self) -> str:
        parts = []
        for f in sorted((self.pipe_dir / "log").glob("*.log")):
            parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def pod_env(self, fraction: str = "", memory: str = "") -> tuple[dict[str, str], int]:
        """The env of a `gpu-fraction: <fraction>` (or `gpu-memory: <memory>`) pod placed on this GPU, and its
        memory limit (MiB)."""
        req = share_request({names.GPU_MEMORY: memory} if memory else {names.GPU_FRACTION: fraction})
        alloc = allocation(req, "gpu-node", self.index, self.uuid, self.memory_mib)
        return pod_env(gpu_env(req), alloc, self.pipe_dir), alloc.memory_mib


def stop_leftovers() -> list[str]:
    """Quit every daemon a test launched and did not stop; their pipe dirs."""
    left = [str(d.pipe_dir) for d in list(Daemon.launched)]
    for d in list(Daemon.launched):
        with contextlib.suppress(AssertionError, OSError, subprocess.SubprocessError):
            d.stop()
    return left
