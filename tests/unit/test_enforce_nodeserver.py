"""The node server sets a GPU container's memory limits on its own cgroup when the handler's hook reports it,
refuses where they cannot be set, clears them on delete; with MPS v3 each container gets its own namespace
(the stand-in daemon, tests/standin/mps_control.py, v3 mode); the simulated allocator knows callers by pid."""

from __future__ import annotations

import json
import os
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.enforce.limiter import Limiter
from agent.enforce.memlimits import Capability
from agent.mpsdaemon.drain import ClientLists
from agent.mpsdaemon.mpscontrol import Control
from agent.mpsdaemon.mpsv3 import Namespaces
from agent.mpsdaemon.pipedirs import PipeDirs
from agent.runtime import nodepods, nodeside
from agent.runtime.nodeserver import AgentSocket, NodeServer
from agent.simgpu.simalloc import Allocator
from agent.simgpu.simulated import SimulatedNvml
from app.core import names, request
from app.core.errors import KubeError
from app.core.model import Allocation
from app.kube.informers import Informer

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "mps_control.py"
CLIENT = Path(__file__).resolve().parents[1] / "standin" / "gpu_alloc.py"
NODE = "gpu-1"
UID = "5d0c2d4e-aaaa-bbbb-cccc-0123456789ab"
ROOT = "/sys/fs/cgroup"
LEAF = f"/kubepods/burstable/pod{UID}/c1"
MIB = 1 << 20


@pytest.fixture
def where() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="enf-", dir="/tmp"))  # short: unix socket paths
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def gpu(where: Path, driver: str = "615.25") -> SimulatedNvml:
    path = where / "gpus.yaml"
    path.write_text(yaml.safe_dump({"driver_version": driver, "gpus": [{"model": "A100-40GB"}]}))
    s = SimulatedNvml(path, NODE, state_dir=where / "state", privileged=True)
    s.init()
    return s


def the_pod(uuid: str, annotations: dict[str, str]) -> dict[str, Any]:
    alloc = Allocation(node=NODE, gpu_indexes=(0,), gpu_uuids=(uuid,), milli=100, memory_mib=4096)
    return {
        "metadata": {"uid": UID, "namespace": "team-a", "name": "burst",
                     "labels": {names.LABEL_MANAGED: "true"},
                     "annotations": {**annotations, **alloc.to_annotations()}},
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}, {"name": "side"}]},
    }  # fmt: skip


BURST = {names.GPU_MEMORY: "4Gi", names.GPU_MEMORY_LIMIT: "8Gi"}


def server(
    where: Path,
    nvml: SimulatedNvml,
    pod: dict[str, Any],
    cap: Capability,
    ns: Namespaces | None = None,
) -> NodeServer:
    (where / "pipe").mkdir(exist_ok=True)
    limiter = Limiter(lambda: nvml, where / "records", ns)
    return NodeServer(
        where / "agent.sock", NODE, PipeDirs(where / "pipe"), lambda req: {"items": [pod]},
        limiter=limiter, capability=lambda: cap, namespaces=ns,
        gpu_mounts=(nodeside.Mount(str(where / "sim-gpu"), "/run/gpupack/sim-gpu"),),
    )  # fmt: skip


ASK = {"pod_uid": UID, "namespace": "team-a", "name": "burst", "container": "main", "container_id": "c1"}


def line(**fields: Any) -> bytes:
    return json.dumps({**ASK, **fields}).encode()


def start(cgroup: str = LEAF, root: str = ROOT, path: str = LEAF, **more: Any) -> bytes:
    return line(op="start", pid=4242, cgroups_path=path, cgroup=cgroup, cgroup_root=root, **more)


CAN = Capability(True, "", ROOT)


def test_a_burstable_containers_limits_are_set_on_its_own_cgroup_and_cleared_on_delete(where: Path) -> None:
    nvml = gpu(where)
    uuid = nvml.uuid(0)
    s = server(where, nvml, the_pod(uuid, {**BURST, names.ISOLATION: "none"}), CAN)
    created = s.reply(line())
    assert created.allowed and created.hook  # the handler adds its createRuntime hook
    assert nodeside.Mount(str(where / "sim-gpu"), "/run/gpupack/sim-gpu") in created.mounts
    assert s.reply(start()).allowed
    assert nvml.limits.limited(uuid)[ROOT + LEAF] | {"set_boottime_ns": 0} == {
        "soft": 4096 * MIB, "hard": 8192 * MIB, "set_boottime_ns": 0,
    }  # fmt: skip
    assert s.reply(json.dumps({"op": "delete", "container_id": "c1"}).encode()).allowed
    assert nvml.limits.limited(uuid) == {} and list((where / "records").iterdir()) == []
    side = s.reply(line(container="side"))
    assert side.allowed and not side.hook and side.mounts == ()  # no GPU: no limits, no allocator


@pytest.mark.parametrize(
    ("message", "said"),
    [
        (start(cgroup="/kubepods/other"), "is in cgroup '/kubepods/other', not in the leaf"),
        (start(root=""), "cgroup v1 only"),
        (start(path="relative"), "names no cgroup this node can place"),
        (start(root="/sys/fs/cgroup/unified"), "the hook found cgroup v2 at /sys/fs/cgroup/unified"),
    ],
)
def test_a_container_whose_cgroup_cannot_carry_its_limits_is_refused(
    where: Path, message: bytes, said: str
) -> None:
    nvml = gpu(where)
    s = server(where, nvml, the_pod(nvml.uuid(0), {**BURST, names.ISOLATION: "none"}), CAN)
    answer = s.reply(message)
    assert not answer.allowed and said in answer.reason, answer.reason
    assert nvml.limits.limited(nvml.uuid(0)) == {}


def test_a_node_without_the_capability_starts_containers_without_the_hook_but_refuses_a_stray_hook(
    where: Path,
) -> None:
    nvml = gpu(where, driver="550.54.15")
    cant = Capability(False, "driver 550.54.15 is older than r615")
    s = server(where, nvml, the_pod(nvml.uuid(0), {**BURST, names.ISOLATION: "none"}), cant)
    created = s.reply(line())
    assert created.allowed and not created.hook
    refused = s.reply(start())
    assert not refused.allowed and "older than r615" in refused.reason


def test_mps_v3_gives_each_container_its_own_namespace_with_both_limits_and_deletes_it(where: Path) -> None:
    env = dict(
        os.environ, CUDA_MPS_PIPE_DIRECTORY=str(where / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(where / "log")
    )
    subprocess.run([sys.executable, str(STANDIN), "-d", "-m", "-p", "3"], env=env, check=True, timeout=20)
    try:
        nvml = gpu(where)
        ns = Namespaces(str(STANDIN), where / "pipe")
        s = server(where, nvml, the_pod(nvml.uuid(0), BURST), CAN, ns)
        created = s.reply(line(container_id="4f" * 32))
        assert created.allowed, created.reason
        (mps,) = [m for m in created.mounts if m.destination == names.MPS_PIPE_DIRECTORY]
        name = "c_" + ("4f" * 32)[:24]
        assert mps.source == str(where / "pipe" / "gpupack" / name)
        assert [p.name for p in Path(mps.source).iterdir()] == ["control"]  # the namespace's directory only
        listed = subprocess.run(
            [sys.executable, str(STANDIN), "namespace", "list", "--format=csv,noheader"],
            env=env, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        # thread share of the allocation (100 milli: 10 %), pinned limit = the pod's hard limit
        assert f"gpupack,{name},8192M,10" in listed.splitlines()
        assert s.reply(json.dumps({"op": "delete", "container_id": "4f" * 32}).encode()).allowed
        assert not Path(mps.source).exists() and ns.listed() == []
    finally:
        subprocess.run(
            [sys.executable, str(STANDIN)], input="quit\n", env=env, text=True, timeout=20, check=False
        )


def ask_allocator(sock: Path, *commands: str, prefix: tuple[str, ...] = ()) -> list[str]:
    argv = [*prefix, sys.executable, str(CLIENT), "--socket", str(sock), *commands]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    return [ln.split(": ", 1)[1] for ln in done.stdout.splitlines()]


def v2_root() -> str:
    mounts = Path("/proc/self/mountinfo").read_text()
    return next((ln.split()[4] for ln in mounts.splitlines() if " - cgroup2 " in ln), "")


@pytest.mark.skipif(
    os.geteuid() != 0 or not v2_root(), reason="a cgroup v2 leaf of its own needs root and v2"
)
def test_the_allocator_knows_its_caller_by_pid_and_cgroup_and_holds_it_to_the_limit(where: Path) -> None:
    nvml = gpu(where)
    uuid = nvml.uuid(0)
    root = v2_root()
    nvml.cgroup_root = root
    leaf = Path(root) / f"gpupack-test-{os.getpid()}"  # the caller's own cgroup, as a container's leaf
    leaf.mkdir()
    try:
        nvml.set_memory_limits(0, str(leaf), 0, 100 * MIB)
        alloc = Allocator(nvml, where / "a.sock", Path("/proc"), root)
        alloc.start()
        try:
            enter = ("sh", "-c", f'echo $$ > {leaf}/cgroup.procs && exec "$@"', "caller")
            who, first, second, third = ask_allocator(
                where / "a.sock",
                "whoami",
                f"alloc {uuid} 60",
                f"alloc {uuid} 40",
                f"alloc {uuid} 1",
                prefix=enter,
            )
            assert who.split()[3] == str(leaf)
            assert (first, second) == (f"ok used={60 * MIB}", f"ok used={100 * MIB}")
            assert third.startswith("refused CUDA_ERROR_OUT_OF_MEMORY: hard limit")
            # Freed with its connection: the allocator's thread sees it close after the caller has exited.
            deadline = time.monotonic() + 10
            while nvml.memory_limits(0, str(leaf)).current_used_bytes and time.monotonic() < deadline:
                time.sleep(0.02)
            assert nvml.memory_limits(0, str(leaf)).current_used_bytes == 0
        finally:
            alloc.stop()
    finally:
        leaf.rmdir()


SERVE_IN_OWN_PID_NAMESPACE = """
import sys, time
from pathlib import Path
from agent.simgpu.simulated import SimulatedNvml
from agent.simgpu.simalloc import Allocator
nvml = SimulatedNvml(Path(sys.argv[1]), "gpu-1", state_dir=Path(sys.argv[2]), privileged=True)
nvml.init()
Allocator(nvml, Path(sys.argv[3]), Path("/proc"), "/sys/fs/cgroup").start()
time.sleep(30)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a pid namespace needs root")
def test_an_allocator_outside_the_callers_pid_namespace_sees_pid_0_and_enforces_nothing(where: Path) -> None:
    """What MPS memory accounting does without hostPID (an agent pod in a pid namespace of its own, its
    callers in the host's or a container's): reproduced, not hidden."""
    nvml = gpu(where)
    uuid = nvml.uuid(0)
    sock = where / "a.sock"
    argv = ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", SERVE_IN_OWN_PID_NAMESPACE,
            str(nvml.path), str(where / "state"), str(sock)]  # fmt: skip
    served = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.monotonic() + 20
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        who, big = ask_allocator(sock, "whoami", f"alloc {uuid} 30000")
        assert who == "pid 0 cgroup -"
        assert big.startswith("ok used=")  # unlimited: no cgroup to charge it to
    finally:
        served.kill()  # --kill-child: the allocator goes with it
        served.wait(10)


def test_the_client_says_when_no_allocator_listens(where: Path) -> None:
    assert ask_allocator(where / "none.sock", "whoami")[0].startswith("no allocator at")


def test_an_agent_restarted_between_create_and_hook_and_again_before_delete_loses_nothing(
    where: Path,
) -> None:
    """The agent restarts (a rollout, a crash) after the handler's create and before its createRuntime
    hook, and again while the container runs: the new agent still sets the container's limits, and the one
    after it still clears them and the record on delete (each restart: a new server, NVML initialised anew
    on the same driver state)."""
    nvml = gpu(where)
    uuid = nvml.uuid(0)
    pod = the_pod(uuid, {**BURST, names.ISOLATION: "none"})
    created = server(where, nvml, pod, CAN).reply(line())
    assert created.allowed and created.hook
    restarted = gpu(where)
    assert server(where, restarted, pod, CAN).reply(start()).allowed
    assert nvml.limits.limited(uuid)[ROOT + LEAF]["hard"] == 8192 * MIB
    again = gpu(where)
    assert list((where / "records").iterdir()) != []
    assert (
        server(where, again, pod, CAN)
        .reply(json.dumps({"op": "delete", "container_id": "c1"}).encode())
        .allowed
    )
    assert again.limits.limited(uuid) == {} and list((where / "records").iterdir()) == []


def test_one_container_is_read_and_parsed_once_for_its_create_hook_stop_and_delete(
    where: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An MPS container with per-cgroup limits asks the agent four times (create, the createRuntime hook, a
    stop, the delete): its pod is read from the apiserver and its request parsed once, at create; the hook
    sets the limits create granted, the stop drains through the daemon, the delete clears them."""
    env = dict(
        os.environ, CUDA_MPS_PIPE_DIRECTORY=str(where / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(where / "log")
    )
    (where / "pipe").mkdir()
    subprocess.run([sys.executable, str(STANDIN), "-d"], env=env, check=True, timeout=20)
    try:
        nvml = gpu(where)
        uuid = nvml.uuid(0)
        # as the extender writes a burstable pod's allocation: its cap above the request
        pod = the_pod(uuid, {**BURST, names.ISOLATION: "mps", names.ALLOC_MEMORY_HARD_LIMIT_MIB: "8192"})
        reads: list[str] = []

        def send(req: Any) -> dict[str, Any]:
            if req.method == "GET":
                reads.append(req.path)
            return {"items": [pod]}

        parses = []
        parse = request.parse

        def counted(view: Any) -> Any:
            parses.append(view.name)
            return parse(view)

        monkeypatch.setattr(request, "parse", counted)
        s = NodeServer(
            where / "agent.sock", NODE, PipeDirs(where / "pipe"), send,
            limiter=Limiter(lambda: nvml, where / "records"), capability=lambda: CAN,
            mps_clients=ClientLists(Control(str(STANDIN), where / "pipe")),
        )  # fmt: skip
        created = s.reply(line())
        assert created.allowed and created.hook, created.reason
        assert created.env[names.ENV_MPS_PIPE_DIRECTORY] == names.MPS_PIPE_DIRECTORY
        assert created.env[names.ENV_MEMORY_HARD_LIMIT_MIB] == "8192"  # burstable: its cap, as the webhook's
        assert s.reply(start()).allowed
        assert nvml.limits.limited(uuid)[ROOT + LEAF]["hard"] == 8192 * MIB
        stopped = s.reply(line(op="stop", pids=[os.getpid()]))  # no MPS client among them: nothing to end
        assert stopped.allowed, stopped.reason
        assert s.reply(json.dumps({"op": "delete", "container_id": "c1"}).encode()).allowed
        assert nvml.limits.limited(uuid) == {} and len(s.grants) == 0
        assert (len(reads), parses) == (1, ["burst"])
    finally:
        subprocess.run(
            [sys.executable, str(STANDIN)], input="quit\n", env=env, text=True, timeout=20, check=False
        )


def test_a_burst_of_questions_that_arrive_before_any_is_accepted_is_queued_then_answered(where: Path) -> None:
    """The kubelet starts and stops many containers at once; each asks the node side over a non-blocking
    unix-socket connect (the handler's), which the kernel refuses with EAGAIN once the accept queue is full.
    64 connects that arrive before the socket accepts any all get in, and each is answered."""

    class Echo(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            self.wfile.write(self.rfile.readline())

    path = where / "agent.sock"
    server = AgentSocket(str(path), Echo)  # listening, not yet accepting: a busy agent
    waiting = []
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    try:
        for i in range(64):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect(str(path))  # BlockingIOError (EAGAIN) if the queue were full
            waiting.append((i, s))
        serving.start()
        for i, s in waiting:
            s.setblocking(True)
            s.settimeout(10)
            s.sendall(f"question {i}\n".encode())
            assert s.makefile("rb").readline() == f"question {i}\n".encode()
    finally:
        for _, s in waiting:
            s.close()
        if serving.is_alive():
            server.shutdown()
        server.server_close()


def test_each_answer_is_timed_under_its_question(where: Path) -> None:
    """gpupack_agent_node_answer_seconds counts every answer under what the handler asked, refusals and
    malformed lines included, so an operator sees how long the node side holds each container's start."""
    from agent import metrics

    registry = metrics.registry()

    def answered(question: str) -> float:
        value = registry.get_sample_value("gpupack_agent_node_answer_seconds_count", {"question": question})
        return value or 0.0

    before = {q: answered(q) for q in metrics.Question}
    nvml = gpu(where)
    s = server(where, nvml, the_pod(nvml.uuid(0), {**BURST, names.ISOLATION: "none"}), CAN)
    assert s.reply(line()).allowed
    assert s.reply(start()).allowed
    assert s.reply(line(op="stop", pids=[os.getpid()])).allowed  # no MPS client: allowed at once
    assert s.reply(json.dumps({"op": "delete", "container_id": "c1"}).encode()).allowed
    assert not s.reply(line(name="gone", pod_uid="0" * 8)).allowed  # a refused create is still an answer
    assert not s.reply(b"not json").allowed
    after = {q: answered(q) - before[q] for q in metrics.Question}
    assert after == {
        metrics.Question.CREATE: 2, metrics.Question.START: 1, metrics.Question.STOP: 1,
        metrics.Question.DELETE: 1, metrics.Question.MALFORMED: 1,
    }  # fmt: skip


class Apiserver:
    """The pods the apiserver has, as the agent's two ways of asking see them: a fresh read of one pod by
    name (NodeServer's own `send`) and a list + watch of the node's pods (the node server's watch)."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.reads: list[dict[str, Any]] = []  # the queries of the fresh reads of one pod
        self.down = False

    def send(self, req: Any) -> dict[str, Any]:
        if self.down:
            raise KubeError(0, "Unreachable", "ConnectionRefusedError: [Errno 111] Connection refused")
        if req.path == "/api/v1/pods":  # the watch's list of the node's pods
            assert req.query["fieldSelector"] == f"spec.nodeName={NODE}"
            return {"metadata": {"resourceVersion": "1"}, "items": list(self.pods.values())}
        self.reads.append(dict(req.query))
        name = req.query["fieldSelector"].removeprefix("metadata.name=")
        return {"items": [p for p in self.pods.values() if p["metadata"]["name"] == name]}

    def watch(self, path: str, query: Any, timeout_s: int = 300) -> Iterator[dict[str, Any]]:
        assert (path, query["fieldSelector"]) == ("/api/v1/pods", f"spec.nodeName={NODE}")
        events, self.events = self.events, []
        yield from events


def watching(where: Path, api: Apiserver) -> tuple[NodeServer, Informer]:
    """A node server answering from its watch of the node's pods (as agent.main wires it), the watch listed
    once; `informer.step()` follows the watch events queued on `api` since."""
    (where / "pipe").mkdir(exist_ok=True)
    pods = nodepods.NodePods()
    informer = nodepods.watch(api, NODE, pods)
    informer.step()  # the first list
    s = NodeServer(
        where / "agent.sock", NODE, PipeDirs(where / "pipe"), api.send, watched=pods.of, pod_watch=informer
    )
    return s, informer


def test_a_create_is_granted_from_the_watched_pod_without_reading_the_apiserver(where: Path) -> None:
    """Once the agent's watch of the node's pods has shown a pod, its containers' creates are granted from
    it, with no apiserver read on their start path; a pod the watch has not shown yet is read fresh."""
    nvml = gpu(where)
    api = Apiserver()
    pod = the_pod(nvml.uuid(0), {**BURST, names.ISOLATION: "none"})
    s, informer = watching(where, api)
    api.pods[UID] = pod  # bound a moment ago: the watch has not shown it yet
    first = s.reply(line())
    assert first.allowed, first.reason
    assert api.reads == [{"fieldSelector": "metadata.name=burst"}]  # fresh: no resourceVersion
    api.events.append({"type": "ADDED", "object": pod})
    informer.step()
    api.reads.clear()
    second = s.reply(line(container_id="c2"))
    assert (second.allowed, second.env) == (first.allowed, first.env)
    assert api.reads == []
    api.down = True  # the watched pod needs no apiserver at all
    assert s.reply(line(container_id="c3")).allowed


def test_a_refusal_is_decided_on_a_fresh_read_never_on_the_watched_pod(where: Path) -> None:
    """The watch's view may lag: a pod deleted and created again under the same name shows there with its
    old uid a while. A container whose pod uid the view does not have is decided on a fresh read: granted
    when the apiserver has its pod, refused when it has not, and refused when the apiserver cannot say."""
    nvml = gpu(where)
    api = Apiserver()
    old = the_pod(nvml.uuid(0), {**BURST, names.ISOLATION: "none"})
    api.pods[UID] = old
    s, _ = watching(where, api)  # the list shows the old pod
    new_uid = "0" * 8
    new = json.loads(json.dumps(old))
    new["metadata"]["uid"] = new_uid
    api.pods = {new_uid: new}  # recreated under the same name; the watch has not shown it yet
    granted = s.reply(line(pod_uid=new_uid, container_id="c2"))
    assert granted.allowed, granted.reason
    assert len(api.reads) == 1
    other = s.reply(line(pod_uid="1" * 8, container_id="c3"))  # a pod neither the view nor etcd has
    assert not other.allowed and "is not in the apiserver" in other.reason
    assert len(api.reads) == 2
    api.down = True
    unread = s.reply(line(pod_uid="2" * 8, container_id="c4"))  # not in the view, apiserver unreachable
    assert not unread.allowed
    assert "cannot read pod team-a/burst (uid 22222222) from the apiserver (0: Connection" in unread.reason


def test_the_watch_follows_the_nodes_pods_as_they_come_and_go(where: Path) -> None:
    """The view holds the node's pods as the watch last showed them: added, changed, deleted, and replaced
    whole by a relist (a pod the relist lacks is gone)."""
    api = Apiserver()
    pods = nodepods.NodePods()
    informer = nodepods.watch(api, NODE, pods)
    pod = the_pod("GPU-a", {names.GPU_FRACTION: "0.5"})
    api.pods[UID] = pod
    informer.step()
    seen = pods.of("team-a", "burst")
    assert seen is not None and seen.uid == UID
    changed = json.loads(json.dumps(pod))
    changed["metadata"]["labels"]["team"] = "a"
    api.events += [{"type": "MODIFIED", "object": changed}]
    informer.step()
    seen = pods.of("team-a", "burst")
    assert seen is not None and seen.labels["team"] == "a"
    api.events += [{"type": "DELETED", "object": changed}]
    informer.step()
    assert pods.of("team-a", "burst") is None
    api.events += [{"type": "ADDED", "object": pod}]
    informer.step()
    api.pods = {}
    informer.request_relist()
    informer.step()
    assert (pods.of("team-a", "burst"), len(pods)) == (None, 0)
