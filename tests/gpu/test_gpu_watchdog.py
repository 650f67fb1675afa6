"""The watchdog (agent/enforce/watchdog.py, agent/enforce/ending.py) on NVML's real process list, beside
NVIDIA's daemon.

UNVERIFIED until run on a GPU: written without one. It asks whether NVML's compute-process list of an MPS
GPU shows a plain process (a context of its own, no pipe directory) and the daemon's clients and server,
whether the watchdog, told by the daemon's client list, picks the plain process and leaves the client and
the server alone, and whether ending it (agent.enforce.ending.HostProcesses: SIGKILL through a pidfd) stops it
while the MPS client keeps its memory.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuclients import Clients, wait_for
from gpuhelpers import Report
from gpumps import Daemon

from agent.enforce import verify
from agent.enforce import watchdog as wd
from agent.enforce.cgroup import PodRef, ProcResolver
from agent.enforce.ending import HostProcesses
from agent.mpsdaemon.drain import ClientLists
from agent.mpsdaemon.mpscontrol import Control
from agent.nvml.base import Nvml
from agent.nvml.sample import Sampler
from app.core import names
from app.core.model import Allocation
from app.core.pods import pod_info

pytestmark = pytest.mark.gpu


@pytest.fixture
def daemon(real_nvml: Nvml, mps_binary: str) -> Iterator[Daemon]:
    d = Daemon(real_nvml, mps_binary, flags=("-M",))
    d.start()
    yield d
    d.stop()


def _hold(driver: Clients, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = driver.start("hold", ["--mib", "256", "--seconds", "120"], env)
    ready = driver.ready(proc, 60)
    assert ready.get("ready"), ready
    return proc


@pytest.mark.answers("watchdog-plain")
def test_the_watchdog_ends_a_plain_process_on_an_mps_gpu_and_leaves_the_clients(
    real_processes: None, daemon: Daemon, driver: Clients, real_nvml: Nvml, report: Report
) -> None:
    env, _ = daemon.pod_env("0.5")
    client = _hold(driver, env)  # an MPS client, as a pod's process
    plain = _hold(driver, {names.ENV_CUDA_VISIBLE_DEVICES: daemon.uuid})  # no pipe dir: a context of its own
    try:
        control = Control(daemon.config.binary, daemon.pipe_dir, 20)
        sample = Sampler(real_nvml).sample()
        listed = sorted(p.pid for p in sample.gpus[0].processes)
        servers = control.server_list()
        assert isinstance(servers, list), servers
        clients = sorted(c for s in servers for c in (control.client_list(s) or []) if isinstance(c, int))
        host = HostProcesses(Path("/proc"), ClientLists(control), 5.0)
        # Both processes stand for the same pod's (the host runs no pods): its allocation is this GPU.
        uid = "0c6a1f5e-2b49-4f0b-8d3e-6f7a9b1c2d30"
        alloc = Allocation("gpu-node", (0,), (daemon.uuid,), 500, 40000)
        pod = pod_info({
            "metadata": {"uid": uid, "namespace": "ml", "name": "trainer",
                         "annotations": {names.GPU_FRACTION: "0.5", **alloc.to_annotations()}},
            "spec": {"containers": [{"name": "main"}]},
            "status": {"containerStatuses": [{"name": "main", "containerID": "containerd://c1"}]},
        })  # fmt: skip
        refs = {pid: PodRef(uid, "c1") for pid in (client.pid, plain.pid)}
        refs |= {pid: None for pid in listed if pid not in refs}
        pods = {uid: pod}
        facts = wd.Facts(
            shared_gpus=frozenset({daemon.uuid}), mps_gpus=frozenset({daemon.uuid}),
            mps_servers=frozenset(servers), mps_clients=frozenset(clients),
            comms={pid: host.comm(pid) for pid in listed},
        )  # fmt: skip
        verdict = verify.verify(sample, refs, pods)
        decision = wd.decide(sample, refs, pods, verdict=verdict, metas={}, facts=facts, policy=wd.Policy())
        picked = {e.pid: e.rule.value for e in decision.endings}
        ended = (
            host.end(plain.pid, ProcResolver().pod_of(plain.pid), mps_client=False)
            if plain.pid in picked
            else None
        )
        gone = wait_for(lambda: plain.poll() is not None, 10)
        report.answer(
            "watchdog-plain",
            f"NVML listed {listed} (client {client.pid}, plain {plain.pid}, servers {servers}); the daemon's "
            f"clients {clients}; the watchdog picked {picked}; "
            f"{'ended' if gone else 'still running'}: {ended.note if ended else '-'}",
            comms=facts.comms, ran_s=None if ended is None else ended.ran_s,
        )  # fmt: skip
        assert plain.pid in listed, "NVML does not list the plain process"
        assert picked == {plain.pid: wd.Rule.NOT_MPS_CLIENT.value}, picked
        assert gone and ended is not None and ended.signalled, ended
        assert client.poll() is None, "the MPS client was hit too"
    finally:
        for p in (plain, client):
            if p.poll() is None:
                Clients.release(p)
