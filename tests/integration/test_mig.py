"""MIG devices through kube-scheduler, the extender and a simulated agent: the right device, the right UUID.

One kwok node of two A100-80GB: GPU 0 partitioned into 3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb (as
`make dev` with --mig makes it), GPU 1 whole. Pods are written as the webhook leaves them (the webhook's
part is covered by the golden files), on this test's pool of nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import test_agent_extender as shared
from podshapes import webhook_pod
from simagents import SimAgents, write_sim
from test_agent_extender import POOL, Extender, bound, explain_row, state_of, unschedulable

from app.core import names
from app.core.model import mig_index
from tests.devcluster import wait_for
from tests.devcluster.addons import sim_document
from tests.devcluster.nodes import MigLayout
from tests.devcluster.poll import WaitTimeoutError

# The agent-and-extender fixtures of test_agent_extender.py (pytest finds fixtures by module attribute).
installed, extender, agents = shared.installed, shared.extender, shared.agents

MODEL = "A100-80GB"
LAYOUT = MigLayout(("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"), gpus=1)


def mig_pod(name: str, namespace: str, annotations: dict[str, str], mib: int) -> dict[str, Any]:
    """A MIG request as the webhook leaves it: charged `mib` of gpu-memory-mib, no MPS env."""
    pod = webhook_pod(name, pool=(POOL, namespace), mem=mib, namespace=namespace, annotations=annotations)
    ann = pod["metadata"]["annotations"]
    if names.MIG_PROFILE in annotations:
        del ann[names.GPU_MEMORY]
    return pod


def test_mig_devices_are_placed_whole_with_their_own_uuids(
    agents: SimAgents,
    extender: Extender,
    gpu_nodes: Callable[..., list[str]],
    core: Any,
    namespace: str,
) -> None:
    (n,) = gpu_nodes(1, gpus_per_node=2, model=MODEL, labels={POOL: namespace})
    write_sim(agents.sim(n), sim_document(MODEL, 2, LAYOUT)["gpus"])
    agents.start(n)

    last: list[Any] = [None]

    def devices() -> dict[int, dict[str, Any]] | None:
        row = last[0] = state_of(extender, n)
        if not row or not row["schedulable"] or len(row["gpus"]) != 5:
            return None
        return {g["index"]: g for g in row["gpus"]}

    # The agent starts, reads its simulated NVML and publishes its GPUNode: slow on a loaded machine.
    try:
        seen = wait_for(devices, 90, f"the extender sees {n}'s GPU 1 and four MIG devices")
    except WaitTimeoutError as exc:
        raise AssertionError(f"{exc}; the extender's last row for {n}: {last[0]!r}") from exc
    assert sorted(seen) == [1, *(mig_index(0, s) for s in range(4))]
    profiles = {i: (g["migProfile"], g["memoryMiB"]) for i, g in seen.items()}
    assert profiles == {
        1: ("", 81920),
        100: ("3g.40gb", 40192),
        101: ("2g.20gb", 19968),
        102: ("1g.10gb", 9728),
        103: ("1g.10gb", 9728),
    }
    uuids = {i: g["uuid"] for i, g in seen.items()}
    assert all(uuids[i].startswith("MIG-") for i in (100, 101, 102, 103)) and len(set(uuids.values())) == 5

    # a whole 1g.10gb: the first free one
    core.create_namespaced_pod(namespace, mig_pod("whole", namespace, {names.MIG_PROFILE: "1g.10gb"}, 9728))
    node, alloc = wait_for(lambda: bound(core, namespace, "whole"), 30, "profile pod bound")
    assert (node, alloc.gpu_indexes, alloc.gpu_uuids) == (n, (102,), (uuids[102],))
    assert (alloc.milli, alloc.memory_mib) == (1000, 9728)

    # 15000 MiB with isolation: mig: the smallest free MIG device that holds it is the 2g.20gb
    core.create_namespaced_pod(namespace, mig_pod("mem", namespace, {names.ISOLATION: "mig"}, 15000))
    node, alloc = wait_for(lambda: bound(core, namespace, "mem"), 30, "memory-to-MIG pod bound")
    assert (node, alloc.gpu_indexes, alloc.gpu_uuids, alloc.memory_mib) == (n, (101,), (uuids[101],), 19968)

    # the same node serves a share on its whole GPU
    share = webhook_pod("share", pool=(POOL, namespace), milli=500, namespace=namespace)
    core.create_namespaced_pod(namespace, share)
    node, alloc = wait_for(lambda: bound(core, namespace, "share"), 30, "share pod bound")
    assert (node, alloc.gpu_indexes, alloc.gpu_uuids, alloc.milli) == (n, (1,), (uuids[1],), 500)

    # 45000 MiB: no MIG device is that large; refused, naming the largest free one (3g.40gb)
    core.create_namespaced_pod(namespace, mig_pod("big", namespace, {names.ISOLATION: "mig"}, 45000))
    message = wait_for(lambda: unschedulable(core, namespace, "big"), 30, "too-large pod unschedulable")
    want = "no free MIG device with 45000 MiB: the largest free is 3g.40gb (40192 MiB)"
    assert want in message, message
    assert explain_row(extender, namespace, "big", n)["reason"].endswith(want)

    # the last 1g.10gb goes to the next profile pod; a third finds none free
    core.create_namespaced_pod(namespace, mig_pod("whole2", namespace, {names.MIG_PROFILE: "1g.10gb"}, 9728))
    _, alloc = wait_for(lambda: bound(core, namespace, "whole2"), 30, "second profile pod bound")
    assert alloc.gpu_uuids == (uuids[103],)
    core.create_namespaced_pod(namespace, mig_pod("whole3", namespace, {names.MIG_PROFILE: "1g.10gb"}, 9728))
    message = wait_for(
        lambda: unschedulable(core, namespace, "whole3"), 30, "third profile pod unschedulable"
    )
    assert "no free MIG device of profile 1g.10gb: the largest free is 3g.40gb (40192 MiB)" in message
