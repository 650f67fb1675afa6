"""Ending a stopping container's MPS clients through the control daemon before any signal reaches them.

Measured (docs/node-side.md, "MPS as measured", "Lifetimes"): an MPS client killed (SIGKILL or SIGTERM) while
its kernels run makes every other client of its server fail with cudaErrorIllegalAddress; ended first with
`terminate_client <server pid> <client pid>`, it fails alone (cudaErrorMpsClientTerminated) and the others
finish. So every stop that passes through the node's runtime (the runtime handler sees `runc kill` and
`runc delete --force`) asks the agent to drain first: each of the container's processes that a server lists
as its client is ended through the daemon, and the drain waits until the server lists none of them, for at
most `timeout_s`. The stop then goes on whatever the outcome: a stop is never held back for long; a drain
that did not finish is reported (the agent logs it, counts it and puts an Event on the pod).

Listing the clients costs one run of the control binary per command (`get_server_list`, then
`get_client_list` per server). Drains that run at once (a deleted Deployment, a drained node) share one
listing (`ClientLists`): a drain never uses a listing that began before it asked, so a process that became
a client before its container's stop is always in the listing the drain reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from agent.mpsdaemon.mpscontrol import Control

# (server pid, client pid), as the daemon lists them.
Pair = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Drained:
    """What a drain did: `ended` clients (server pid, client pid) no server lists any more; `left` those
    still listed when it gave up; `problem` why it gave up ("" when it finished)."""

    ended: tuple[Pair, ...] = ()
    left: tuple[Pair, ...] = ()
    problem: str = ""
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return not self.problem and not self.left


class _Round:
    """One listing that callers share: its answer once `done`."""

    __slots__ = ("answer", "done")

    def __init__(self) -> None:
        self.done = False
        self.answer: list[Pair] | str = ""


class ClientLists:
    """Every (server, client) pair the daemon lists, asked of it at most once at a time.

    A caller that finds no listing running starts one. A caller that finds one running waits for the next
    one, which it shares with every caller that arrived during the same running listing: the listing it
    reads began after it asked. Under a burst of N drains the daemon is asked about twice per listing time
    instead of N times; a lone drain waits for no one. A caller waits for other callers' listings no longer
    than it is told (its drain's deadline); the daemon's own answers are bounded by the control binary's
    timeout."""

    def __init__(self, control: Control) -> None:
        self.control = control
        self._cond = threading.Condition()
        self._running: _Round | None = None  # the listing asked of the daemon now
        self._next: _Round | None = None  # the listing that starts when the running one ends
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """How many callers wait for a listing to start or end now."""
        with self._cond:
            return self._waiting

    def pairs(self, wait_s: float) -> list[Pair] | str:
        """Every pair the daemon lists now, or why they cannot be had (none within `wait_s` included)."""
        until = time.monotonic() + wait_s
        with self._cond:
            if self._running is None:
                mine = self._running = _Round()
            else:
                mine = self._next = self._next or _Round()
                while True:
                    if mine.done:  # another caller of this round asked the daemon
                        return mine.answer
                    if self._running is None:  # the listing before ended: this caller asks now
                        self._running, self._next = mine, None
                        break
                    left = until - time.monotonic()
                    if left <= 0:
                        return f"no listing of the MPS daemon's clients within {wait_s:g} s"
                    self._waiting += 1
                    self._cond.wait(left)
                    self._waiting -= 1
        answer: list[Pair] | str = "the MPS daemon's clients were not listed"
        try:
            answer = _list(self.control)
        finally:
            with self._cond:
                mine.answer, mine.done = answer, True
                self._running = None
                self._cond.notify_all()
        return answer


def drain(
    lists: ClientLists,
    pids: Collection[int],
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Drained:
    """End every MPS client among `pids` (host pids of the container's processes) through the daemon."""
    start = clock()
    deadline = start + timeout_s
    mine = set(pids)
    found = _among(lists.pairs(timeout_s), mine)
    if isinstance(found, str):
        return Drained(problem=found, seconds=clock() - start)
    if not found:
        return Drained(seconds=clock() - start)
    for server, client in found:
        if clock() >= deadline:
            break
        asked = lists.control.terminate_client(server, client)
        if asked:
            return Drained(left=tuple(found), problem=asked, seconds=clock() - start)
    left: list[Pair] | str = found
    while True:
        left = _among(lists.pairs(max(0.0, deadline - clock())), mine)
        if isinstance(left, str):
            return Drained(left=tuple(found), problem=left, seconds=clock() - start)
        if not left or clock() >= deadline:
            break
        sleep(0.05)
    ended = tuple(c for c in found if c not in left)
    problem = f"clients still listed after {timeout_s:g} s" if left else ""
    return Drained(ended=ended, left=tuple(left), problem=problem, seconds=clock() - start)


def _among(listed: list[Pair] | str, pids: set[int]) -> list[Pair] | str:
    return listed if isinstance(listed, str) else [(s, c) for s, c in listed if c in pids]


def _list(control: Control) -> list[Pair] | str:
    """(server pid, client pid) of every client of every server the daemon runs."""
    servers = control.server_list()
    if isinstance(servers, str):
        return servers
    out: list[Pair] = []
    for server in servers:
        clients = control.client_list(server)
        if isinstance(clients, str):
            return clients
        out += [(server, c) for c in clients]
    return out
