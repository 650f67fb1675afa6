"""The node side's own code on NVIDIA's daemon: the agent's probe finds it (agent/mpsdaemon/pipedirs.py), the
agent's drain before a stop keeps a busy neighbour working (agent/mpsdaemon/drain.py), and a share's env as
gpupack sets it gives the memory the docs promise (docs/node-side.md, "Memory a share can use")."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest
from gpuclients import Clients
from gpuhelpers import Report
from gpuhost import REHEARSAL
from gpumps import Daemon

from agent.mpsdaemon.drain import ClientLists, drain
from agent.mpsdaemon.mpscontrol import Control
from agent.mpsdaemon.pipedirs import PipeDirs
from agent.nvml.base import Nvml
from app.core import names

pytestmark = pytest.mark.gpu
# The rehearsal's fake driver and control model neither MPS lifetimes nor the context's share of a limit.
not_in_rehearsal = pytest.mark.skipif(
    REHEARSAL, reason="rehearsal: the fake models no MPS lifetimes or context"
)
CONTEXT_MIB = 514  # measured: the driver API context's share of a pinned limit


@pytest.fixture
def daemon(real_nvml: Nvml, mps_binary: str) -> Iterator[Daemon]:
    d = Daemon(
        real_nvml, mps_binary, flags=("-M",)
    )  # as the chart runs it, adopted by the agent's supervisor
    d.start()
    yield d
    d.stop()


@pytest.mark.answers("probe-real")
def test_the_agents_probe_finds_the_real_daemon(daemon: Daemon, report: Report) -> None:
    why = PipeDirs(daemon.pipe_dir).backend_down()
    report.answer("probe-real", why or "the daemon answers the probe")
    assert why == "", why


def _busy(driver: Clients, daemon: Daemon, seconds: float) -> tuple[subprocess.Popen[str], int]:
    env, _ = daemon.pod_env("0.5")
    proc = driver.start("busy", ["--mib", "256", "--seconds", str(seconds)], env)
    ready = driver.ready(proc, 60)
    assert ready.get("ready"), ready
    return proc, proc.pid


@not_in_rehearsal
@pytest.mark.answers("drain-neighbour")
@pytest.mark.parametrize("drained", [True, False], ids=["drained", "not-drained"])
def test_a_drained_stop_keeps_a_busy_neighbour_working(
    daemon: Daemon, driver: Clients, report: Report, drained: bool
) -> None:
    victim, victim_pid = _busy(driver, daemon, 120)
    neighbour, _ = _busy(driver, daemon, 10)
    lists = ClientLists(Control(daemon.config.binary, daemon.pipe_dir, 10))
    done = drain(lists, [victim_pid], 5.0) if drained else None
    os.kill(victim_pid, signal.SIGKILL)
    victim.wait(30)
    result = Clients.finish(neighbour, 60)
    report.answer(
        "drain-neighbour",
        f"{'drained' if drained else 'not drained'}: the neighbour "
        f"{'finished' if result.body.get('done') else 'failed: ' + str(result.body.get('failure'))}",
        drain=None if done is None else {"ended": done.ended, "left": done.left, "problem": done.problem,
                                         "seconds": round(done.seconds, 3)},
        neighbour=result.body,
    )  # fmt: skip
    if drained:
        assert done is not None and done.complete and done.ended, done
        assert result.body.get("done"), f"a drained stop still broke the neighbour: {result.body}"
    else:
        assert not result.body.get("done"), f"the neighbour survived an undrained kill: {result.body}"


@not_in_rehearsal
@pytest.mark.answers("share-usable")
def test_a_2gi_share_allocates_what_the_docs_promise(daemon: Daemon, driver: Clients, report: Report) -> None:
    env, limit = daemon.pod_env(memory="2Gi")
    assert env[names.ENV_MPS_MEMORY_LIMIT] == f"0={limit}M" or env[names.ENV_MPS_MEMORY_LIMIT].endswith(
        f"={limit}M"
    )
    r = driver.run("alloc", ["--cap-mib", str(2 * limit), "--step-mib", "256"], env)
    got, promised = int(r.body.get("max_mib", 0)), limit - CONTEXT_MIB
    report.answer("share-usable", f"{got} MiB of a {limit} MiB share (docs: {promised})", client=r.body)
    assert abs(got - promised) <= 0.02 * limit, f"{got} MiB, docs promise {promised} MiB"
