"""The dev cluster's real node (`python -m tests.devcluster up --real-node`) runs the chart's node side: an
MPS pod in a `baseline` namespace runs there, with no hostPath, in its own MPS directory given by the runtime
handler.

Real-node tier (markers integration and realnode): root only; its own `dev up` cluster, torn down with
`dev down`, which must leave nothing of the node behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core import names
from app.kube.client import Kube
from tests.devcluster import BinariesError, ensure_binaries, kubeletnode
from tests.realnode.pods import busybox_pod, new_namespace, run_to_completion

pytestmark = pytest.mark.realnode

Run = Callable[..., Any]
# What the GPU container sees first: its own MPS directory holds only the link to the daemon's socket.
PROBE = (
    'echo "MPSDIR=$(ls -A "$CUDA_MPS_PIPE_DIRECTORY" | tr "\\n" " ")"; '
    'test -S "$CUDA_MPS_PIPE_DIRECTORY/control" && echo "CONTROL=socket"; '
    'echo "PIPE=$CUDA_MPS_PIPE_DIRECTORY"'
)


@pytest.fixture(scope="module")
def dev(
    tmp_path_factory: pytest.TempPathFactory, run_devcluster: Run
) -> Iterator[tuple[Path, dict[str, str]]]:
    if os.geteuid() != 0:
        pytest.skip("a real node needs root (a network bridge, mounts and cgroups for the kubelet)")
    try:
        bins = ensure_binaries()
    except BinariesError as exc:
        pytest.fail(f"needs Kubernetes binaries:\n{exc}", pytrace=False)
    # Short: containerd's sockets live under it, and a unix socket path has at most 104 bytes.
    d = tmp_path_factory.mktemp("devrn")
    env = {**os.environ, "GPUPACK_K8S_BIN": str(bins)}
    up = run_devcluster(
        "up", "--dir", str(d), "--real-node", "--nodes", "1", "--gpus-per-node", "2", env=env
    )  # fmt: skip
    try:
        if up.returncode != 0:
            logs = "\n".join(
                f"---- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((d / "logs").glob("*"))
            )
            pytest.fail(f"dev up --real-node failed ({up.returncode}):\n{up.stderr}\n{logs}", pytrace=False)
        yield d, env
    finally:
        down = run_devcluster("down", "--dir", str(d), env=env, timeout=180)
        assert down.returncode == 0, down.stderr


def test_an_mps_pod_in_a_baseline_namespace_runs_on_the_real_node_in_its_own_mps_directory(
    dev: tuple[Path, dict[str, str]],
) -> None:
    d, _ = dev
    kube = Kube.connect(str(d / "kubeconfig"))
    try:
        ns = new_namespace(kube, {"pod-security.kubernetes.io/enforce": "baseline"})
        node = kubeletnode.DEFAULT_NAME
        body = busybox_pod("mps", {names.GPU_FRACTION: "0.5"}, {"main": ["sh", "-c", PROBE]}, node)
        done = run_to_completion(kube, ns, body)
        assert done["spec"]["runtimeClassName"] == "gpupack"
        assert not [v for v in done["spec"].get("volumes") or [] if "hostPath" in v]
        assert done["status"]["phase"] == "Succeeded", done["status"]
        log = kube.text(f"/api/v1/namespaces/{ns}/pods/mps/log", {"container": "main"})
        out = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
        assert out == {"MPSDIR": "control ", "CONTROL": "socket", "PIPE": names.MPS_PIPE_DIRECTORY}
        # The node's pipe directory holds the pod's own directory, which the handler mounted.
        uid = done["metadata"]["uid"]
        assert (d / "mps-pipe" / "pods" / uid / "control").is_socket()
    finally:
        kube.close()
