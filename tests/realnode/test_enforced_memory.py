"""Enforced GPU memory on a real kubelet + containerd 1.6 node: per-cgroup limits set by the node side on each
container's own cgroup before its first process, held against a containerized allocator, cleared on delete:
a burstable pod (gpu-memory 4Gi, gpu-memory-limit 8Gi), a half share and a pod written with KAI's NvFractions
request/limit annotations, on one GPU.

No GPU here: the GPU is simulated (its driver reports r615, so per-cgroup limits are available) and keeps
its per-cgroup limits and allocations in the simulated driver's state (agent/simgpu/simlimits.py, a file per
GPU under the cluster's `sim-driver` directory, read here from the host). The containers allocate through
the agent's simulated allocator (agent/simgpu/simalloc.py) with the STAND-IN CUDA process
tests/standin/gpu_alloc.py; the allocator knows each caller by its socket peer pid and /proc/<pid>/cgroup, as
MPS memory accounting does. The node runs hybrid cgroups (v2 at /sys/fs/cgroup/unified): the simulation keys
limits by the container's v2 leaf there, which real NVIDIA drivers would not accept (they need v2 at
/sys/fs/cgroup).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.core import names
from app.kube.calls import Request
from app.kube.client import Kube
from tests.devcluster import Cluster, kubeletnode, wait_for
from tests.devcluster.identities import GPUPACK_NAMESPACE

from . import chart
from .pods import RUN_TIMEOUT_S, busybox_pod, idle_node, new_namespace

MIB = 1 << 20
MAX = 0xFFFFFFFFFFFFFFFF
SOURCE = Path(__file__).resolve().parents[2] / "tests/standin/gpu_alloc.py"


def script(first: int, second: int) -> str:
    """The container's command: the boot clock, then (its first GPU call) the limits of its own cgroup, then
    allocations on its GPU held in one context: `first` MiB, `second` MiB, then 1 MiB more."""
    return (
        "echo \"UPTIME=$(cut -d' ' -f1 /proc/uptime)\"; "
        "python3 /standin/gpu_alloc.py limits whoami; "
        'while read -r l; do echo "PROC=$l"; done < /proc/self/cgroup; '
        'G="$CUDA_VISIBLE_DEVICES"; echo ALLOCS; '
        f'python3 /standin/gpu_alloc.py "alloc $G {first}" "alloc $G {second}" "alloc $G 1" limits; '
        "echo DONE; sleep 3600"
    )


def table(cluster: Cluster, uuid: str) -> dict[str, Any]:
    """The simulated driver's limits and allocations of one GPU, as the host has them."""
    path = cluster.dir / "sim-driver" / "memory-limits" / f"{uuid}.json"
    return json.loads(path.read_text()) if path.exists() else {"limits": {}, "allocations": {}}


def answers(log: str, after: str = "") -> dict[int, str]:
    """`<n>: <answer>` lines of the stand-in process (after the line `after`, if given)."""
    lines = log.splitlines()
    if after:
        lines = lines[lines.index(after) + 1 :]
    out: dict[int, str] = {}
    for line in lines:
        head, sep, rest = line.partition(": ")
        if sep and head.isdigit() and int(head) not in out:
            out[int(head)] = rest
    return out


def fields(entry: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in entry.split() if "=" in w)


def test_limits_on_each_containers_own_cgroup_before_its_first_process_held_and_cleared(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    cluster, node = real_cluster
    idle_node(kube, node.name)
    ns = new_namespace(kube)
    image = chart.pods(kube, "agent")[0]["spec"]["containers"][0]["image"]  # has python3 for the client
    configmap = {"metadata": {"name": "standin"}, "data": {"gpu_alloc.py": SOURCE.read_text()}}
    kube.send(Request("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap))
    # A whole GPU held first: the two shares can only meet on the other one.
    whole = {names.GPU_FRACTION: "1", names.ISOLATION: "none"}
    kube.send(
        Request(
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            busybox_pod("whole", whole, {"main": ("sleep", "3600")}, node.name),
        )
    )
    shares: dict[str, tuple[dict[str, str], int, int, tuple[int, int]]] = {
        # request 4Gi, limit 8Gi: soft 4096 MiB, hard 8192 MiB; it can take 4096 + 4096, not 1 MiB more
        "burstable": ({names.GPU_MEMORY: "4Gi", names.GPU_MEMORY_LIMIT: "8Gi"}, 4096, 8192, (4096, 4096)),
        # half an A100-40GB (40960 MiB): soft = hard = 20480 MiB
        "half": ({names.GPU_FRACTION: "0.5"}, 20480, 20480, (16384, 4096)),
        # KAI's NvFractions request/limit example, for the container `main`: soft 2048 MiB, hard 4096 MiB
        "kai": (
            {
                "nvidia.com/container.main.gpu-memory.request": "2048Mi",
                "nvidia.com/container.main.gpu-memory.limit": "4096Mi",
            },
            2048,
            4096,
            (2048, 2048),
        ),
    }
    for name, (wanted, _soft, _hard, (first, second)) in shares.items():
        pod = busybox_pod(name, wanted, {"main": ("sh", "-c", script(first, second))}, node.name)
        spec = pod["spec"]
        spec["volumes"] = [{"name": "standin", "configMap": {"name": "standin"}}]
        spec["containers"][0] |= {
            "image": image,
            "volumeMounts": [{"name": "standin", "mountPath": "/standin"}],
        }
        kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", pod))

    logs: dict[str, str] = {}

    def done() -> bool:
        for name in shares:
            try:
                logs[name] = kube.text(f"/api/v1/namespaces/{ns}/pods/{name}/log", {"container": "main"})
            except Exception:  # not started yet
                return False
        return all("DONE" in logs[n] for n in shares)

    wait_for(done, 2 * RUN_TIMEOUT_S, "both GPU containers through their allocations", interval=1)
    pods = {n: kube.send(Request("GET", f"/api/v1/namespaces/{ns}/pods/{n}")) for n in shares}
    (uuid,) = {p["metadata"]["annotations"][names.ALLOC_GPU_UUIDS] for p in pods.values()}  # one GPU
    held = table(cluster, uuid)
    print({n: logs[n] for n in shares}, json.dumps(held, indent=1))
    root = "/sys/fs/cgroup/unified"
    keys = set()
    for name, (_ann, soft, hard, (first, second)) in shares.items():
        log = logs[name]
        lines = log.splitlines()
        uptime_ns = float(next(line for line in lines if line.startswith("UPTIME="))[7:]) * 1e9
        v2 = next(line for line in lines if line.startswith("PROC=0::"))[len("PROC=0::") :]
        cgroup = root + v2
        first_call = answers(log)
        (limits,) = [e for e in first_call[1].split("; ") if e.startswith(uuid)]
        got = fields(limits)
        # The container's first GPU call reads its limits back, on its own cgroup, set before it began.
        assert (int(got["soft"]), int(got["hard"])) == (soft * MIB, hard * MIB), log
        assert 0 < int(got["set_boottime_ns"]) < uptime_ns, log
        assert first_call[2].split()[3] == cgroup, log  # the allocator saw the caller in that cgroup
        # The simulated NVML holds exactly that cgroup's limits.
        assert held["limits"][cgroup]["soft"] == soft * MIB and held["limits"][cgroup]["hard"] == hard * MIB
        keys.add(cgroup)
        # The cgroup is the container's own leaf: /kubepods/<qos>/pod<uid>/<container id>
        cid = pods[name]["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
        assert v2.endswith(f"/pod{pods[name]['metadata']['uid']}/{cid}"), v2
        # Up to its limit, and refused past it.
        allocs = answers(log, after="ALLOCS")
        assert allocs[1] == f"ok used={first * MIB}", log
        assert allocs[2] == f"ok used={(first + second) * MIB}", log
        assert allocs[3].startswith("refused CUDA_ERROR_OUT_OF_MEMORY: hard limit"), log
        (after,) = [e for e in allocs[4].split("; ") if e.startswith(uuid)]
        assert fields(after)["used"] == str((first + second) * MIB), log  # currentUsed: what it holds
    assert len(keys) == len(shares) and set(held["limits"]) >= keys

    for name in (*shares, "whole"):
        kube.send(Request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0}))

    def gone() -> bool:
        listed = kube.send(Request("GET", f"/api/v1/namespaces/{ns}/pods"))["items"]
        return not listed

    wait_for(gone, RUN_TIMEOUT_S, "the pods deleted", interval=1)
    records = chart.node_side_state_dir(cluster) / "limits"

    def clean() -> bool:
        left = table(cluster, uuid)
        return (
            not (set(left["limits"]) & keys) and not list(records.glob("*.json")) and not left["allocations"]
        )

    wait_for(clean, 60, "no limit, record or allocation left after the pods were deleted", interval=1)
    kube.send(Request("DELETE", f"/api/v1/namespaces/{ns}"))


def v3(cluster: Cluster, *argv: str) -> str:
    """An MPS v3 command to the node's (stand-in) daemon from the host, as an operator would send it."""
    env = {"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": str(chart.mps_pipe_dir(cluster))}
    argv = (sys.executable, str(chart.STANDIN_SOURCE), *argv)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    # The control binary exits 0 whenever the daemon answered, errors too: its words tell them apart.
    return done.stdout if done.returncode == 0 and not done.stderr.strip() else f"error: {done.stderr}"


def use_protocol(kube: Kube, cluster: Cluster, helm_bin: str, protocol: int) -> None:
    """Switch the node's MPS to `protocol`: upgrade the release, replace the daemon pod (OnDelete), wait until
    a new agent runs with it and the new daemon answers in that protocol."""
    before = {p["metadata"]["name"] for c in ("agent", "mps-daemon") for p in chart.pods(kube, c)}
    chart.helm(helm_bin, cluster, "upgrade", chart.RELEASE, str(chart.CHART), "--reuse-values",
               "--set", f"agent.mps.protocol={protocol}")  # fmt: skip
    for pod in chart.pods(kube, "mps-daemon"):
        path = f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/pods/{pod['metadata']['name']}"
        kube.send(Request("DELETE", path))

    def switched() -> bool:
        agent, daemon = chart.pods(kube, "agent"), chart.pods(kube, "mps-daemon")
        if (
            len(agent) != 1
            or len(daemon) != 1
            or {agent[0]["metadata"]["name"], daemon[0]["metadata"]["name"]} & before
        ):
            return False
        args = agent[0]["spec"]["containers"][0].get("args", [])
        answers_v3 = not v3(cluster, "server", "list").startswith("error")
        return (
            chart.installed(kube) and f"--mps-protocol={protocol}" in args and answers_v3 == (protocol == 3)
        )

    wait_for(switched, 240, f"a new agent and MPS daemon on protocol {protocol}", interval=1)


def pod_report(kube: Kube, ns: str, name: str) -> str:
    """What the pod, its events and the agent say (for a failure message)."""
    pod = kube.send(Request("GET", f"/api/v1/namespaces/{ns}/pods/{name}"))
    events = [
        e.get("message", "") for e in kube.send(Request("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
    ]
    agent = chart.pods(kube, "agent")[0]["metadata"]["name"]
    log = kube.text(f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/pods/{agent}/log", {"tailLines": "40"})
    return f"status: {json.dumps(pod.get('status'))}\nevents: {events}\nagent log:\n{log}"


V3_FIRST = (
    "echo \"UPTIME=$(cut -d' ' -f1 /proc/uptime)\"; "
    'echo "MPSDIR=$(ls -A "$CUDA_MPS_PIPE_DIRECTORY" | tr "\\n" " ")"; '
    'echo "CLIENT=$(python3 /standin/mps_control.py client --timeout 10)"; '
    "python3 /standin/gpu_alloc.py limits; echo DONE; sleep 3600"
)


def test_mps_v3_gives_each_container_a_namespace_of_its_own_deleted_with_it(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, helm_bin: str
) -> None:
    cluster, node = real_cluster
    idle_node(kube, node.name)
    use_protocol(kube, cluster, helm_bin, 3)
    try:
        ns = new_namespace(kube)
        image = chart.pods(kube, "agent")[0]["spec"]["containers"][0]["image"]
        data = {"gpu_alloc.py": SOURCE.read_text(), "mps_control.py": chart.STANDIN_SOURCE.read_text()}
        kube.send(
            Request(
                "POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "standin"}, "data": data}
            )
        )
        burst = {
            names.GPU_MEMORY: "4Gi",
            names.GPU_MEMORY_LIMIT: "8Gi",
        }  # an MPS share (the default isolation)
        pod = busybox_pod("burst", burst, {"main": ("sh", "-c", V3_FIRST)}, node.name)
        pod["spec"]["volumes"] = [{"name": "standin", "configMap": {"name": "standin"}}]
        pod["spec"]["restartPolicy"] = "OnFailure"  # a start refused while the node settled is retried
        pod["spec"]["containers"][0] |= {
            "image": image,
            "volumeMounts": [{"name": "standin", "mountPath": "/standin"}],
        }
        kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", pod))
        path = f"/api/v1/namespaces/{ns}/pods/burst"
        log = ""

        def done() -> bool:
            nonlocal log
            try:
                log = kube.text(f"{path}/log", {"container": "main"})
            except Exception:  # not started yet
                return False
            return "DONE" in log

        try:
            wait_for(done, 2 * RUN_TIMEOUT_S, "the v3 client through its first commands", interval=1)
        except Exception:
            pytest.fail(f"the v3 pod did not get through:\n{log}\n{pod_report(kube, ns, 'burst')}")
        stored = kube.send(Request("GET", path))
        cid = stored["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
        name = f"c_{cid[:24]}"
        threads = stored["metadata"]["annotations"][names.ALLOC_THREAD_PERCENTAGE]
        seen = dict(line.split("=", 1) for line in log.splitlines() if "=" in line and line[:1].isupper())
        print(log, v3(cluster, "namespace", "list", "--format=csv,noheader"))
        # Its whole MPS directory is its namespace's: the namespace's control socket and nothing else.
        assert seen["MPSDIR"].split() == ["control"], log
        # A named namespace inherits nothing: both limits set, the pinned one = the pod's hard limit.
        assert seen["CLIENT"].endswith(f"namespace gpupack/{name} pinned 8192M threads {threads}"), log
        assert f"gpupack,{name},8192M,{threads}" in v3(cluster, "namespace", "list", "--format=csv,noheader")
        assert (chart.mps_pipe_dir(cluster) / "gpupack" / name / "control").exists()
        # and the per-cgroup limits too
        (limits,) = [
            e
            for e in answers(log)[1].split("; ")
            if e.startswith(stored["metadata"]["annotations"][names.ALLOC_GPU_UUIDS])
        ]
        assert fields(limits)["hard"] == str(8192 * MIB), log
        kube.send(Request("DELETE", path, {"gracePeriodSeconds": 0}))
        wait_for(
            lambda: not kube.send(Request("GET", f"/api/v1/namespaces/{ns}/pods"))["items"],
            RUN_TIMEOUT_S,
            "deleted",
        )

        def gone() -> bool:
            listed = v3(cluster, "namespace", "list", "--format=csv,noheader")
            return name not in listed and not listed.startswith("error")

        wait_for(gone, 60, "the container's namespace deleted with it", interval=1)
        assert not (chart.mps_pipe_dir(cluster) / "gpupack" / name).exists()
        assert not list((chart.node_side_state_dir(cluster) / "limits").glob("*.json"))
        kube.send(Request("DELETE", f"/api/v1/namespaces/{ns}"))
    finally:
        use_protocol(kube, cluster, helm_bin, 2)
