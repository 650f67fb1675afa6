"""app.core.podview: the one reading of a pod that every part of gpupack takes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core import names, podview
from app.core.hostres import HostResources
from app.core.podview import ContainerView, Kind, Mount, PodView, Volume


def pod(
    annotations: dict[str, str] | None = None,
    containers: list[Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "main"}] if containers is None else containers, **spec},
    }


# --- the GPU container: the annotation, else the first regular container ---


@pytest.mark.parametrize(
    ("annotations", "spec", "want"),
    [
        pytest.param({}, {"containers": [{"name": "a"}, {"name": "b"}]}, "a", id="first-regular"),
        pytest.param(
            {names.GPU_FRACTION_CONTAINER_NAME: "b"},
            {"containers": [{"name": "a"}, {"name": "b"}]},
            "b",
            id="annotation",
        ),
        pytest.param(
            {names.GPU_FRACTION_CONTAINER_NAME: "side"},
            {"containers": [{"name": "a"}], "initContainers": [{"name": "side", "restartPolicy": "Always"}]},
            "side",
            id="annotation-names-an-init-container",
        ),
        pytest.param(
            {},
            {"initContainers": [{"name": "setup"}], "containers": [{"name": "a"}]},
            "a",
            id="init-never-chosen-by-default",
        ),
        pytest.param(
            {names.GPU_FRACTION_CONTAINER_NAME: ""},
            {"containers": [{"name": "a"}]},
            "a",
            id="empty-annotation-is-the-default",
        ),
        pytest.param(
            {names.GPU_FRACTION_CONTAINER_NAME: "nope"},
            {"containers": [{"name": "a"}]},
            "nope",
            id="unknown-name-kept-for-the-rule-to-refuse",
        ),
        pytest.param({}, {"containers": []}, None, id="no-container"),
        pytest.param(
            {}, {"containers": [], "initContainers": [{"name": "i"}]}, None, id="only-init-containers"
        ),
    ],
)
def test_gpu_container(annotations: dict[str, str], spec: dict[str, Any], want: str | None) -> None:
    view = podview.read({"metadata": {"annotations": annotations}, "spec": spec})
    assert view.gpu_container == want


# --- containers: order, kind, pointer, field path ---


def test_regular_then_init_containers_with_pointer_and_field_path() -> None:
    view = podview.read(
        pod(
            containers=[{"name": "a"}, {"name": "b"}],
            initContainers=[{"name": "i0"}, {"name": "side", "restartPolicy": "Always"}],
        )
    )
    got = [(c.kind, c.name, c.pointer, c.where, c.init, c.sidecar) for c in view.containers]
    assert got == [
        (Kind.REGULAR, "a", "/spec/containers/0", "spec.containers[a]", False, False),
        (Kind.REGULAR, "b", "/spec/containers/1", "spec.containers[b]", False, False),
        (Kind.INIT, "i0", "/spec/initContainers/0", "spec.initContainers[i0]", True, False),
        (Kind.INIT, "side", "/spec/initContainers/1", "spec.initContainers[side]", True, True),
    ]
    assert [c.name for c in view.regular] == ["a", "b"]


def test_ephemeral_containers_are_read_apart_and_never_get_the_gpu() -> None:
    """`kubectl debug` adds them to a running pod; no rule counts them as the pod's containers."""
    view = podview.read(
        pod(containers=[], ephemeralContainers=[{"name": "debugger", "env": [{"name": "X", "value": "1"}]}])
    )
    assert view.containers == ()
    assert [(c.kind, c.name, c.pointer) for c in view.ephemeral] == [
        (Kind.EPHEMERAL, "debugger", "/spec/ephemeralContainers/0")
    ]
    assert view.ephemeral[0].env["X"] == {"name": "X", "value": "1"}
    assert view.gpu_container is None


# --- env by name: the entry the kubelet applies ---


def test_env_by_name_keeps_the_last_entry_of_a_name() -> None:
    first = {"name": names.ENV_NVIDIA_VISIBLE_DEVICES, "value": "all"}
    last = {"name": names.ENV_NVIDIA_VISIBLE_DEVICES, "value": names.NO_GPU}
    other = {"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    view = podview.read(pod(containers=[{"name": "c", "env": [first, other, last, "junk", {"value": "x"}]}]))
    assert view.containers[0].env == {names.ENV_NVIDIA_VISIBLE_DEVICES: last, "A": other}


# --- resources ---


def test_resources_whole_gpus_ours_and_host_requests() -> None:
    res = {
        "limits": {"nvidia.com/gpu": "1", names.RESOURCE_GPU_MILLI: "500", "cpu": "2"},
        "requests": {"nvidia.com/gpu": 2, names.RESOURCE_GPU_MILLI: "250", "memory": "1Gi"},
    }
    c = podview.read(pod(containers=[{"name": "c", "resources": res}])).containers[0]
    assert c.whole_gpus == "1"  # the limit, when both are written
    assert c.ours == ((names.RESOURCE_GPU_MILLI, "250"),)  # the request first
    assert c.requests["nvidia.com/gpu"] == 2 and c.limits["cpu"] == "2"  # as sent
    assert (
        c.resource("nvidia.com/gpu") == "1"
        and c.without(("nvidia.com/gpu",)).resource("nvidia.com/gpu") is None
    )
    assert c.host == HostResources(cpu_milli=2000, memory_mib=1024)  # cpu: the limit defaults the request
    assert c.resource("nvidia.com/gpu") == "1" and c.resource("memory") == "1Gi" and c.resource("x") is None
    assert c.has_resources


def test_a_request_only_whole_gpu_counts() -> None:
    c = podview.read(pod(containers=[{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "2"}}}]))
    assert c.containers[0].whole_gpus == "2"


def test_without_drops_resources_but_keeps_the_host_request() -> None:
    res = {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "cpu": "1"}}
    c = podview.read(pod(containers=[{"name": "c", "resources": res}])).containers[0]
    out = c.without(("nvidia.com/gpu", "nvidia.com/gpumem"))
    assert out.whole_gpus is None and out.limits == {"cpu": "1"} and out.host == c.host


def test_with_takeover_rereads_the_annotations() -> None:
    view = podview.read(pod(containers=[{"name": "a"}, {"name": "b"}]))
    assert not view.ask.wanted
    b = view.containers[1]
    out = view.with_takeover({names.GPU_MEMORY: "2048", names.GPU_FRACTION_CONTAINER_NAME: "b"}, b)
    assert out.ask.wanted and out.ask.memory == "2048" and out.gpu_container == "b"
    assert out.containers == view.containers and view.annotations == {}


def test_pod_host_request_counts_sidecars_beside_the_containers_and_adds_overhead() -> None:
    def c(name: str, cpu: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "resources": {"requests": {"cpu": cpu}}, **extra}

    view = podview.read(
        pod(
            containers=[c("main", "1")],
            initContainers=[c("side", "500m", restartPolicy="Always"), c("big", "3")],
            overhead={"cpu": "100m"},
        )
    )
    # max(main + side, side + big) + overhead
    assert view.host == HostResources(cpu_milli=3600)


# --- the pod's own fields ---


def test_identity_phase_volumes_mounts_and_container_ids() -> None:
    obj = pod(
        {names.GPU_FRACTION: "0.5"},
        containers=[
            {
                "name": "c",
                "volumeMounts": [
                    {"name": "mps", "mountPath": "/m"},
                    {"name": "data", "mountPath": "/d", "subPath": "x"},
                    {"name": 3, "mountPath": "/bad"},
                ],
            }
        ],
        volumes=[{"name": "mps", "hostPath": {"path": "/tmp/nvidia-mps"}}, {"name": "data", "emptyDir": {}}],
        nodeName="n1",
        schedulerName="gpupack",
    )
    obj["metadata"].update(labels={names.LABEL_MANAGED: "true"}, deletionTimestamp="2026-01-01T00:00:00Z")
    obj["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": "c", "containerID": "containerd://abc"}],
        "initContainerStatuses": [{"name": "i", "containerID": "cri-o://def"}, {"name": "j"}],
    }
    view = podview.read(obj)
    assert (view.uid, view.namespace, view.name, view.resource_version) == ("u1", "ns", "p", "7")
    assert (view.node_name, view.phase, view.deleting, view.scheduler_name) == (
        "n1",
        "Running",
        True,
        "gpupack",
    )
    assert view.labels == {names.LABEL_MANAGED: "true"}
    assert view.ask.fraction == "0.5" and view.ask.wanted
    assert view.volumes == (Volume("mps", "/tmp/nvidia-mps"), Volume("data"))
    assert view.containers[0].mounts == (
        Mount("mps", "/m", whole_dir=True),
        Mount("data", "/d", whole_dir=False),
    )
    assert view.container_ids == {"abc": "c", "def": "i"}


@pytest.mark.parametrize(
    ("annotations", "wanted"),
    [
        ({names.GPU_FRACTION: "x"}, True),
        ({names.GPU_MEMORY: ""}, True),
        ({names.MIG_PROFILE: "1g.10gb"}, True),
        ({names.GPU_FRACTION_NUM_DEVICES: "2", names.GPU_MODEL: "T4"}, False),
        ({}, False),
    ],
)
def test_a_gpu_share_is_asked_by_fraction_memory_or_mig_profile(
    annotations: dict[str, str], wanted: bool
) -> None:
    assert podview.ask_of(annotations).wanted is wanted
    assert podview.read(pod(annotations)).ask.wanted is wanted


# --- hostile inputs: wrong types read as empty, never raise ---


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param({}, id="empty"),
        pytest.param({"metadata": [], "spec": "x", "status": 3}, id="wrong-types"),
        pytest.param({"spec": {"containers": "abc", "initContainers": {"a": 1}}}, id="containers-not-lists"),
        pytest.param(
            {
                "metadata": {"annotations": {"gpu-fraction": 0.5, 3: "x"}, "labels": ["a"], "uid": None},
                "spec": {
                    "containers": [
                        "junk",
                        None,
                        {"name": 7, "env": {"a": 1}, "resources": {"limits": [], "requests": "1"}},
                        {"name": "ok", "resources": {"limits": {"cpu": True, "memory": None}}},
                    ],
                    "volumes": [None, {"name": 1, "hostPath": "x"}],
                    "nodeName": 5,
                },
                "status": {"phase": None, "containerStatuses": [None, {"containerID": 3}]},
            },
            id="hostile-entries",
        ),
    ],
)
def test_hostile_objects_read_as_empty(obj: dict[str, Any]) -> None:
    view = podview.read(obj)
    assert view.ask.wanted is False and view.labels == {} and view.node_name == "" and view.phase == "Pending"
    for c in view.containers:
        assert c.name in ("", "ok") and c.env == {} and c.ours == () and c.host == HostResources()
    assert all(v.name is None and v.host_path is None for v in view.volumes)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=20,
)
_KEYS = st.sampled_from(
    [
        "metadata",
        "spec",
        "status",
        "containers",
        "initContainers",
        "ephemeralContainers",
        "env",
        "resources",
        "requests",
        "limits",
        "name",
        "annotations",
        "labels",
        "volumes",
        "volumeMounts",
        "hostPath",
        "path",
    ]
)


@given(
    st.recursive(
        _JSON,
        lambda inner: st.dictionaries(_KEYS, inner, max_size=4) | st.lists(inner, max_size=3),
        max_leaves=30,
    )
)
def test_any_json_reads_without_raising(obj: Any) -> None:
    if isinstance(obj, dict):
        view = podview.read(obj)
        assert isinstance(view, PodView)
        assert all(isinstance(c, ContainerView) and isinstance(c.name, str) for c in view.containers)


@pytest.mark.parametrize(
    "annotations",
    [{}, {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_CONTAINER_NAME: "init", "note": "x"}],
    ids=["no-annotations", "a-gpu-share"],
)
def test_a_read_view_is_the_view_its_constructor_makes(annotations: dict[str, str]) -> None:
    """`read` sets the fields at once, past the dataclass's __init__: it must set every one, as __init__
    (and the GPU ask it works out) would."""
    raw = pod(
        annotations,
        [{"name": "main", "resources": {"requests": {"cpu": "1"}}}],
        initContainers=[{"name": "init", "restartPolicy": "Always"}],
        nodeName="n1",
        schedulerName="s",
        affinity={"nodeAffinity": {}},
    )
    raw["metadata"].update(labels={"app": "a"}, deletionTimestamp="2026-01-01T00:00:00Z")
    view = podview.read(raw)
    made = dataclasses.replace(view)  # through __init__ and __post_init__
    assert made == view and made.ask == view.ask and made.source is view.source
    assert {f.name: getattr(made, f.name) for f in dataclasses.fields(PodView)} == {
        f.name: view.__dict__[f.name] for f in dataclasses.fields(PodView)
    }
