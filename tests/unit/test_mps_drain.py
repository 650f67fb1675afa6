"""Draining stopping containers' MPS clients through the daemon, alone and many at once (the stand-in daemon).

The daemon and the CUDA clients are tests/standin/mps_control.py, which follows the measured table
(docs/node-side.md, "MPS as measured", "Lifetimes": a busy client killed breaks the other clients of its
server; ended by terminate_client first, the others finish). The control binary the agent runs is a small
wrapper around the stand-in that writes down each command, so the tests count what the daemon was asked.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from agent.mpsdaemon.drain import ClientLists, Drained, Pair, drain
from agent.mpsdaemon.mpscontrol import Control

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "mps_control.py"
# The control binary as the agent runs it: one command on stdin. It writes the command to `asked`, answers
# with the stand-in's answer and, for a `get_server_list` while `hold` exists, holds that answer back (the
# daemon has already answered) until `release` exists, so a test can act while a listing is in flight.
WRAPPER = """#!/bin/sh
IFS= read -r line
echo "$line" >> "{dir}/asked"
out=$(printf '%s\\n' "$line" | "{python}" "{standin}" "$@"); rc=$?
if [ "$line" = get_server_list ] && [ -e "{dir}/hold" ]; then
  rm "{dir}/hold"; touch "{dir}/held"
  while [ ! -e "{dir}/release" ]; do sleep 0.01; done
fi
printf '%s\\n' "$out"
exit $rc
"""
DEADLINE_S = 30.0


@dataclass
class Daemon:
    dir: Path
    pipe: Path
    control: Control
    env: dict[str, str]

    def asked(self, command: str) -> int:
        """How many times the control binary was run with `command`."""
        path = self.dir / "asked"
        lines = path.read_text().splitlines() if path.exists() else []
        return sum(line.split()[0] == command for line in lines if line)

    def client(self, work_s: float) -> tuple[subprocess.Popen[str], int]:
        """A stand-in CUDA client with work in flight for `work_s`; it and its server's pid."""
        proc = subprocess.Popen(
            [sys.executable, str(STANDIN), "client", "--work", str(work_s)],
            env=self.env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == ["server"], line
        return proc, int(line[1])


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    where = Path(tempfile.mkdtemp(prefix="mps-drain-", dir="/tmp"))
    pipe = where / "pipe"
    pipe.mkdir()
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(pipe))
    subprocess.run([sys.executable, str(STANDIN), "-d", "-M"], env=env, check=True, timeout=20)
    wrapper = where / "nvidia-cuda-mps-control"
    wrapper.write_text(WRAPPER.format(dir=where, python=sys.executable, standin=STANDIN))
    wrapper.chmod(0o755)
    try:
        yield Daemon(where, pipe, Control(str(wrapper), pipe, timeout_s=20), env)
    finally:
        subprocess.run([sys.executable, str(STANDIN)], input="quit\n", env=env, text=True, timeout=20,
                       capture_output=True, check=False)  # fmt: skip
        shutil.rmtree(where, ignore_errors=True)


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def at_once(calls: list[Callable[[], Drained]]) -> list[Drained]:
    """Run the drains in threads started together; their results in order."""
    results: list[Drained] = [Drained(problem="did not return")] * len(calls)
    go = threading.Barrier(len(calls))

    def run(i: int) -> None:
        go.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    return results


def test_two_containers_stopped_at_once_are_drained_and_their_busy_neighbour_finishes(daemon: Daemon) -> None:
    stopped = [daemon.client(600), daemon.client(600)]
    neighbour, _ = daemon.client(8)
    lists = ClientLists(daemon.control)
    done = at_once([partial(drain, lists, [p.pid], 10.0) for p, _ in stopped])
    for (proc, server), drained in zip(stopped, done, strict=True):
        assert drained.complete and drained.ended == ((server, proc.pid),), drained
        proc.send_signal(signal.SIGKILL)  # the runtime's kill, after the drain
        proc.wait(20)
    out, _ = neighbour.communicate(timeout=30)
    assert neighbour.returncode == 0 and out.split()[-1] == "done", out


def test_stops_arriving_together_share_listings_and_each_gets_only_its_own_clients(daemon: Daemon) -> None:
    mine, server = daemon.client(600)
    try:
        lists = ClientLists(daemon.control)
        others = [os.getpid()] * 7  # processes that hold no MPS context: nothing of theirs to end
        done = at_once([partial(drain, lists, [p], 10.0) for p in [mine.pid, *others]])
        assert done[0].ended == ((server, mine.pid),) and done[0].complete, done[0]
        assert all(d.complete and not d.ended and not d.left for d in done[1:]), done
        # 8 drains: one listing without the shared one, at least 2 polls after terminate_client: >= 10 alone
        assert daemon.asked("get_server_list") < 8, daemon.asked("get_server_list")
        assert daemon.asked("terminate_client") == 1
    finally:
        mine.kill()
        mine.wait(20)


def test_a_drain_never_reads_a_listing_that_began_before_it_asked(daemon: Daemon) -> None:
    """A listing in flight when a stop arrives may predate a client of the stopping container: the stop
    waits for the next listing, which it shares with the other stops that arrived meanwhile."""
    lists = ClientLists(daemon.control)
    (daemon.dir / "hold").touch()
    first: list[list[Pair] | str] = []
    before = threading.Thread(target=lambda: first.append(lists.pairs(DEADLINE_S)))
    before.start()
    until((daemon.dir / "held").exists, "the first listing in flight")
    late, server = daemon.client(600)  # a client the first listing cannot hold
    try:
        later: list[list[Pair] | str] = []
        waiting = [threading.Thread(target=lambda: later.append(lists.pairs(DEADLINE_S))) for _ in range(3)]
        for t in waiting:
            t.start()
        until(lambda: lists.waiting == 3, "three callers waiting for the next listing")
        (daemon.dir / "release").touch()
        before.join(DEADLINE_S)
        for t in waiting:
            t.join(DEADLINE_S)
        assert first and isinstance(first[0], list) and (server, late.pid) not in first[0], first
        assert later == [[(server, late.pid)]] * 3, later
        assert daemon.asked("get_server_list") == 2  # the first, then one for the three that waited
    finally:
        late.kill()
        late.wait(20)


def test_a_stop_waits_for_another_stops_listing_no_longer_than_its_drain_may_take(daemon: Daemon) -> None:
    lists = ClientLists(daemon.control)
    (daemon.dir / "hold").touch()
    before = threading.Thread(target=lists.pairs, args=(DEADLINE_S,))
    before.start()
    try:
        until((daemon.dir / "held").exists, "the first listing in flight")
        drained = drain(lists, [os.getpid()], 0.2)
        assert not drained.complete
        assert drained.problem == "no listing of the MPS daemon's clients within 0.2 s", drained
    finally:
        (daemon.dir / "release").touch()
        before.join(DEADLINE_S)


def test_a_daemon_that_does_not_answer_is_the_drains_problem_for_every_waiting_stop(daemon: Daemon) -> None:
    subprocess.run([sys.executable, str(STANDIN)], input="quit\n", env=daemon.env, text=True, timeout=20,
                   capture_output=True, check=False)  # fmt: skip
    until(lambda: not (daemon.pipe / "control").exists(), "the daemon gone")
    lists = ClientLists(daemon.control)
    done = at_once([partial(drain, lists, [os.getpid()], 5.0) for _ in range(4)])
    assert all(not d.complete and d.problem.startswith("get_server_list: ") for d in done), done


def test_the_watchdog_and_the_stops_drain_through_the_nodes_one_listing(tmp_path: Path) -> None:
    """As the agent is wired (agent.command): the watchdog's drains and the runtime handler's stops share
    one ClientLists, so a watchdog drain during a burst of stops reads the same listings as the stops, and
    its control runs are bounded by the drain timeout."""
    import yaml

    from agent.enforce.ending import HostProcesses
    from agent.main import build, mps_client_lists, node_server
    from agent.settings import Settings

    sim = tmp_path / "gpus.yaml"
    sim.write_text(yaml.safe_dump({"driver_version": "580.1", "gpus": [{"model": "A100-40GB"}]}))
    settings = Settings(
        node="n1", sim=sim, sim_state=tmp_path / "state", mps_binary=str(STANDIN),
        mps_pipe_dir=tmp_path / "pipe", node_socket=tmp_path / "agent.sock", mps_drain_timeout_s=7.0,
    )  # fmt: skip
    lists = mps_client_lists(settings)
    assert lists is not None and lists.control.timeout_s == 7.0
    agent = build(settings, lambda r: {"items": []}, time.monotonic, lists)
    server = node_server(settings, NoPods(), agent, lists)
    assert isinstance(agent.hands, HostProcesses) and server is not None
    assert agent.hands.mps_clients is lists and server.mps_clients is lists
    without = Settings(node="n1", sim=sim, sim_state=tmp_path / "state", mps=False)
    assert mps_client_lists(without) is None


class NoPods:
    """An apiserver with no pods, as the node server reads it: a pod by name, and the node's pods watched."""

    def send(self, req: object) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": "1"}, "items": []}

    def watch(self, path: str, query: object, timeout_s: int = 300) -> Iterator[dict[str, Any]]:
        return iter(())
