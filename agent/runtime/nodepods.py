"""The node's pods as the agent's watch has them, so a container's `create` is answered without an apiserver
read on its start path.

The kubelet starts a pod's containers only after its own watch has shown it the pod bound to this node, and
the sandbox takes a while more; the agent's watch of the same pods (`fieldSelector spec.nodeName=<node>`)
has shown it the pod by then. The node server grants a container from this view where the view grants it,
and reads the pod from the apiserver only where the view does not have the pod (yet) or would refuse: a
refusal is always decided on the pod as etcd has it (agent.runtime.nodeserver).

A pod in the view is one bound to this node, so its allocation was written before its binding and no longer
changes (only the extender may write it, and it moves a pod by evicting it, a new pod with a new uid). A view
that lags (a watch broken, relisting) lacks the newest pods, which are then read from the apiserver; it
never grants a pod the apiserver would not: the grant checks the pod's uid against the container's.
"""

from __future__ import annotations

import threading

from app.core import podview
from app.core.podview import PodView
from app.kube import paths
from app.kube.calls import JsonDict
from app.kube.informers import Informer, InformerConfig, KubeApi, object_key

# A relist every 10 minutes heals anything a watch silently missed; a watch call ends every 4 minutes. The
# view is never gated on being live (a lagging view only sends more creates to the apiserver), so
# live_within_s only has to satisfy the informer's rule.
INFORMER = InformerConfig(resync_s=600, watch_timeout_s=240, live_within_s=300)


class NodePods:
    """namespace/name → the pod as last listed or watched; an informer's handler, read by the node server's
    threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, JsonDict] = {}

    def of(self, namespace: str, name: str) -> PodView | None:
        """The pod by that name as the watch last showed it; None when it has not (yet)."""
        with self._lock:
            pod = self._pods.get(f"{namespace}/{name}")
        return None if pod is None else podview.read(pod)

    def listing(self) -> None:
        """Nothing to do before a list: `replace` swaps the whole view at once."""

    def replace(self, objs: list[JsonDict]) -> None:
        pods = {object_key(o): o for o in objs}
        with self._lock:
            self._pods = pods

    def upsert(self, obj: JsonDict) -> None:
        with self._lock:
            self._pods[object_key(obj)] = obj

    def delete(self, obj: JsonDict) -> None:
        with self._lock:
            self._pods.pop(object_key(obj), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)


def watch(kube: KubeApi, node: str, pods: NodePods) -> Informer:
    """The informer that keeps `pods` in step with the pods bound to `node` (start it; stop it)."""
    return Informer(
        kube,
        paths.pods(),
        pods,
        name="node-pods",
        field_selector=f"spec.nodeName={node}",
        config=INFORMER,
    )
