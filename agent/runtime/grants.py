"""What the node granted each container at its `create`, kept for the same container's hook, stop and delete.

One container's life asks the agent up to four times (create, the createRuntime hook, a stop, the delete).
The grant is decided once, at create, from one read of the pod: the hook then sets the limits that create
promised, and the stop knows whether the container is an MPS client at all, without asking the apiserver
again or deciding anew from a pod that may have changed in between. The store lives in the agent's memory:
after an agent restart a container's first question finds nothing here, and the agent decides its grant
again from the pod as the apiserver has it (the node's own facts, limits set and MPS namespaces, are kept
by agent.enforce.limiter on disk).
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass

from agent.runtime.nodeside import Grant


@dataclass(frozen=True, slots=True)
class Granted:
    pod_uid: str
    grant: Grant


class Grants:
    """container id → its grant; safe to use from the node server's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_container: dict[str, Granted] = {}

    def keep(self, container_id: str, pod_uid: str, grant: Grant) -> None:
        with self._lock:
            self._by_container[container_id] = Granted(pod_uid, grant)

    def of(self, container_id: str, pod_uid: str) -> Grant | None:
        """The grant of that container of that pod; None when unknown (a restart, or another pod's id)."""
        with self._lock:
            granted = self._by_container.get(container_id)
        return granted.grant if granted is not None and granted.pod_uid == pod_uid else None

    def forget(self, container_id: str) -> None:
        with self._lock:
            self._by_container.pop(container_id, None)

    def prune(self, keep_pods: Collection[str]) -> list[str]:
        """Forget the containers of pods no longer on the node (a delete the agent missed); their ids."""
        with self._lock:
            gone = [cid for cid, g in self._by_container.items() if g.pod_uid not in keep_pods]
            for cid in gone:
                del self._by_container[cid]
        return gone

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_container)
