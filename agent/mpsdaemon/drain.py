"""Ending a stopping container's MPS clients through the control daemon before any signal reaches them.

Measured (docs/node-side.md, "MPS as measured", "Lifetimes"): an MPS client killed (SIGKILL or SIGTERM) while
its kernels run makes every other client of its server fail with cudaErrorIllegalAddress; ended first with
`terminate_client <server pid> <client pid>`, it fails alone (cudaErrorMpsClientTerminated) and the others
finish. So every stop that passes through the node's runtime (the runtime handler sees `runc kill` and
`runc delete --force`) asks the agent to drain first: each of the container's processes that a server lists
as its client is ended through the daemon, and the drain waits until the server lists none of them, for at
most `timeout_s`. The stop then goes on whatever the outcome: a stop is never held back for long; a drain
that did not finish is reported (the agent logs it, counts it and puts an Event on the pod).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from agent.mpsdaemon.mpscontrol import Control


@dataclass(frozen=True, slots=True)
class Drained:
    """What a drain did: `ended` clients (server pid, client pid) no server lists any more; `left` those
    still listed when it gave up; `problem` why it gave up ("" when it finished)."""

    ended: tuple[tuple[int, int], ...] = ()
    left: tuple[tuple[int, int], ...] = ()
    problem: str = ""
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return not self.problem and not self.left


def drain(
    control: Control,
    pids: Collection[int],
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Drained:
    """End every MPS client among `pids` (host pids of the container's processes) through the daemon."""
    start = clock()
    deadline = start + timeout_s
    mine = set(pids)
    found = _clients(control, mine)
    if isinstance(found, str):
        return Drained(problem=found, seconds=clock() - start)
    if not found:
        return Drained(seconds=clock() - start)
    for server, client in found:
        if clock() >= deadline:
            break
        asked = control.terminate_client(server, client)
        if asked:
            return Drained(left=tuple(found), problem=asked, seconds=clock() - start)
    left: list[tuple[int, int]] | str = found
    while True:
        left = _clients(control, mine)
        if isinstance(left, str):
            return Drained(left=tuple(found), problem=left, seconds=clock() - start)
        if not left or clock() >= deadline:
            break
        sleep(0.05)
    ended = tuple(c for c in found if c not in left)
    problem = f"clients still listed after {timeout_s:g} s" if left else ""
    return Drained(ended=ended, left=tuple(left), problem=problem, seconds=clock() - start)


def _clients(control: Control, pids: set[int]) -> list[tuple[int, int]] | str:
    """(server pid, client pid) of each of `pids` that a server lists as its client."""
    servers = control.server_list()
    if isinstance(servers, str):
        return servers
    out = []
    for server in servers:
        clients = control.client_list(server)
        if isinstance(clients, str):
            return clients
        out += [(server, c) for c in clients if c in pids]
    return out
