"""Pods that bring their own MPS pipe directory, against the real apiserver: the chart's `mps-pipe-dir`
ValidatingAdmissionPolicy refuses a hostPath volume of the pipe directory, of a directory above it or of one
below it, however the path is spelled, with the volume and the reason; other hostPaths pass, and the release's
own namespace (the MPS daemon and the agent mount the directory) is exempt.

The policy comes from the rendered deploy/manifests/gpupack.yaml (default values: pipe directory
/tmp/nvidia-mps, release namespace gpupack-system), bound only to this test's namespaces
(addons.scoped_binding).
Every pod is created with dryRun=All: admission runs in full, nothing is stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from app.core.errors import KubeError
from app.kube import calls
from app.kube.client import Kube
from tests.devcluster import GPUPACK_NAMESPACE, wait_for
from tests.devcluster.addons import MANIFEST_RELPATH, create, install_policies, policy_objects, scoped_binding

REPO = Path(__file__).resolve().parents[2]
PIPE = "/tmp/nvidia-mps"


def pod(*paths: str) -> dict[str, Any]:
    """A pod with one hostPath volume per path (named v0, v1, ...), each mounted into its container."""
    volumes = [{"name": f"v{i}", "hostPath": {"path": p}} for i, p in enumerate(paths)]
    mounts = [{"name": v["name"], "mountPath": f"/mnt/{v['name']}"} for v in volumes]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "brings-its-own"},
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "volumeMounts": mounts}],
            "volumes": volumes,
        },
    }


def admit(kube: Kube, namespace: str, body: dict[str, Any]) -> str:
    """ "" when the apiserver admits the pod (dry run), else its message."""
    try:
        kube.send(calls.create(body, namespace, dry_run=True))
    except KubeError as exc:
        assert exc.code in (403, 422), (exc.code, exc.message)
        return exc.message
    return ""


@pytest.fixture
def policed(kube: Any, namespace: str) -> Iterator[Kube]:
    """The chart's mps-pipe-dir policy bound to `namespace` and to the release's namespace."""
    docs = [d for d in yaml.safe_load_all((REPO / MANIFEST_RELPATH).read_text()) if d]
    policy, binding = [
        o for o in policy_objects(docs, ("mps-daemon",)) if o["metadata"]["name"].endswith("-mps-pipe-dir")
    ]
    create(kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GPUPACK_NAMESPACE}})
    bindings = [scoped_binding(binding, namespace=ns) for ns in (namespace, GPUPACK_NAMESPACE)]
    install_policies(kube, [policy, *bindings])
    k = Kube(kube)
    wait_for(
        lambda: admit(k, namespace, pod(PIPE)) != "", 30, "the mps-pipe-dir policy in effect", interval=0.2
    )
    try:
        yield k
    finally:
        api = client.AdmissionregistrationV1Api(kube)
        for b in bindings:
            api.delete_validating_admission_policy_binding(b["metadata"]["name"])
        api.delete_validating_admission_policy(policy["metadata"]["name"])


@pytest.mark.parametrize(
    "path",
    [
        PIPE,
        f"{PIPE}/",
        "/tmp",
        "/",
        f"{PIPE}/control_privileged",
        f"{PIPE}/pods/5d0c2d4e-aaaa-bbbb-cccc-0123456789ab",
        "//tmp/./nvidia-mps//",
        "/tmp/.",
    ],
)
def test_a_hostpath_reaching_the_pipe_directory_is_refused_with_the_volume_and_the_reason(
    policed: Kube, namespace: str, path: str
) -> None:
    said = admit(policed, namespace, pod("/data", path))
    assert f"hostPath volume v1 ({path}) reaches the node MPS pipe directory {PIPE}" in said, said
    assert "control_privileged" in said and "remove the volume" in said
    assert "v0" not in said  # only the volume that reaches it is named


@pytest.mark.parametrize(
    "path", ["/data", "/tmp/nvidia-mps-logs", "/tmpx", "/var/tmp/nvidia-mps", "/tmp/other"]
)
def test_other_hostpaths_pass(policed: Kube, namespace: str, path: str) -> None:
    assert admit(policed, namespace, pod(path)) == ""


def test_the_releases_own_namespace_is_exempt(policed: Kube) -> None:
    """The MPS daemon and the agent mount the pipe directory; their namespace is left out of the policy."""
    assert admit(policed, GPUPACK_NAMESPACE, pod(PIPE)) == ""


def test_a_namespace_marked_by_an_administrator_is_exempt(policed: Kube, core: Any, namespace: str) -> None:
    """Pods that still mount the directory themselves (admitted before the node side) go in a namespace
    labelled gpupack.io/mps-pipe-dir=allowed."""
    core.patch_namespace(namespace, {"metadata": {"labels": {"gpupack.io/mps-pipe-dir": "allowed"}}})
    wait_for(
        lambda: admit(policed, namespace, pod(PIPE)) == "", 30, "the marked namespace exempt", interval=0.2
    )
