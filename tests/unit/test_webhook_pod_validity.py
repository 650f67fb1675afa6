"""A mutation never produces an invalid pod: arbitrary user volumes, mounts, env and containers, mutated, then
checked with the apiserver's own pod rules for what our patch touches (names unique, mounts resolve, mount
paths unique per container, env entries well-formed, extended resources with request = limit)."""

from __future__ import annotations

import posixpath
import re
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_webhook_mutate import apply_patch, decide, decoded, review_of

from app.core import managed, names, podview
from webhook import mutate
from webhook.metrics import WebhookOutcome
from webhook.settings import Settings

HOST_DIR = names.MPS_PIPE_DIRECTORY
OUR_ENV = [
    names.ENV_NVIDIA_VISIBLE_DEVICES,
    names.ENV_CUDA_VISIBLE_DEVICES,
    names.ENV_MPS_THREAD_PERCENTAGE,
    names.ENV_MPS_MEMORY_LIMIT,
    names.ENV_MPS_PIPE_DIRECTORY,
    names.ENV_MEMORY_LIMIT_MIB,
]
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_HOST_PATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice"}


def apiserver_errors(pod: dict[str, Any]) -> list[str]:
    """The subset of the apiserver's ValidatePodSpec that covers every field our patch writes."""
    spec = pod["spec"]
    errors: list[str] = []
    volumes: dict[str, Any] = {}
    for v in spec.get("volumes") or ():
        if not _DNS_LABEL.fullmatch(v["name"]) or v["name"] in volumes:
            errors.append(f"spec.volumes[{v['name']}]: invalid or duplicate name")
        volumes[v["name"]] = v
        if "hostPath" in v and v["hostPath"].get("type", "") not in _HOST_PATH_TYPES:
            errors.append(f"spec.volumes[{v['name']}].hostPath.type: unsupported")
    seen: set[str] = set()
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        if c["name"] in seen:
            errors.append(f"container {c['name']}: duplicate name")
        seen.add(c["name"])
        paths: set[str] = set()
        for m in c.get("volumeMounts") or ():
            if m["name"] not in volumes:
                errors.append(f"{c['name']}.volumeMounts[{m['name']}]: not found")
            if m["mountPath"] in paths:
                errors.append(f"{c['name']}.volumeMounts.mountPath {m['mountPath']}: must be unique")
            paths.add(m["mountPath"])
        for e in c.get("env") or ():
            if not _ENV_NAME.fullmatch(e["name"]) or ("value" in e) == ("valueFrom" in e):
                errors.append(f"{c['name']}.env[{e['name']}]: invalid")
        res = c.get("resources") or {}
        for key, value in (res.get("requests") or {}).items():
            if "/" in key and (res.get("limits") or {}).get(key) != value:
                errors.append(f"{c['name']}.resources[{key}]: extended resource request must equal limit")
    return errors


_VOLUME_NAMES = ["data", mutate.MPS_VOLUME, f"{mutate.MPS_VOLUME}-2", "mps", "nvidia-mps"]
_VOLUME_SOURCES = st.sampled_from(
    [
        {"emptyDir": {}},
        {"hostPath": {"path": HOST_DIR}},
        {"hostPath": {"path": HOST_DIR + "/", "type": "Directory"}},
        {"hostPath": {"path": "/data"}},
    ]
)
_MOUNT_PATHS = [HOST_DIR, "/var/run/mps", "/data", "/tmp"]
_ENV_VALUES = st.sampled_from(["all", "void", HOST_DIR, "/var/run/mps", "1"])


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    vnames = draw(st.lists(st.sampled_from(_VOLUME_NAMES), unique=True, max_size=4))
    volumes = [{"name": n, **draw(_VOLUME_SOURCES)} for n in vnames]

    def container(name: str) -> dict[str, Any]:
        c: dict[str, Any] = {"name": name, "image": "x"}
        if vnames and draw(st.booleans()):
            paths = draw(st.lists(st.sampled_from(_MOUNT_PATHS), unique=True, min_size=1, max_size=3))
            c["volumeMounts"] = [{"name": draw(st.sampled_from(vnames)), "mountPath": p} for p in paths]
            if draw(st.integers(0, 5)) == 0:
                c["volumeMounts"][0]["subPath"] = "x"
        if draw(st.booleans()):
            entry = st.fixed_dictionaries(
                {"name": st.sampled_from([*OUR_ENV, "X", "LD_LIBRARY_PATH"]), "value": _ENV_VALUES}
            )
            c["env"] = draw(st.lists(entry, max_size=3))
        return c

    regular = [container(f"c{i}") for i in range(draw(st.integers(1, 2)))]
    inits = [container(f"i{i}") for i in range(draw(st.integers(0, 2)))]
    if inits and draw(st.booleans()):
        inits[-1]["restartPolicy"] = "Always"  # a sidecar
    annotations = {names.GPU_FRACTION: "0.5"}
    if draw(st.booleans()):
        annotations[names.GPU_FRACTION_CONTAINER_NAME] = draw(
            st.sampled_from([c["name"] for c in regular + inits])
        )
    if draw(st.integers(0, 3)) == 0:
        annotations[names.ISOLATION] = "none"
    if draw(st.integers(0, 3)) == 0:  # a HAMi pod instead (taken over): shares on one container, or two
        del annotations[names.GPU_FRACTION]
        annotations.pop(names.GPU_FRACTION_CONTAINER_NAME, None)
        hami = draw(st.sampled_from([{"nvidia.com/gpumem": "1k"}, {"nvidia.com/gpucores": "30"}]))
        for c in draw(st.lists(st.sampled_from(regular + inits), min_size=1, max_size=2, unique_by=id)):
            c["resources"] = {"limits": {"nvidia.com/gpu": "1", **hami}}
    spec: dict[str, Any] = {"containers": regular}
    if inits:
        spec["initContainers"] = inits
    if volumes:
        spec["volumes"] = volumes
    labels = {"kai.scheduler/queue": "team-a"}
    return {"metadata": {"name": "p", "labels": labels, "annotations": annotations}, "spec": spec}


def _gpu_container(pod: dict[str, Any]) -> dict[str, Any]:
    name = pod["metadata"]["annotations"].get(
        names.GPU_FRACTION_CONTAINER_NAME, pod["spec"]["containers"][0]["name"]
    )
    (c,) = [c for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []) if c["name"] == name]
    return c


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=pods())
def test_mutated_pod_is_valid_and_keeps_everything_the_user_wrote(obj: dict[str, Any]) -> None:
    assert apiserver_errors(obj) == []  # the generator writes only pods the apiserver accepts
    cfg = Settings(hami_takeover=True)
    decision = decide(review_of(obj), cfg)
    event(decision.outcome.value)
    if decision.outcome is WebhookOutcome.DENIED:
        # Refused only for a clash, naming it: an env var of ours set otherwise, or the pipe mount path taken.
        for message in decision.messages:
            if "gpupack gives one container per pod a GPU share" in message:
                continue  # HAMi shares on two containers
            assert any(f".env[{v}]=" in message for v in OUR_ENV) or f"='{HOST_DIR}': is where" in message, (
                message
            )
        return
    assert decision.outcome is WebhookOutcome.MUTATED
    out = apply_patch(obj, decoded(decision.response))
    assert apiserver_errors(out) == []
    assert managed.unmanaged_errors(podview.read(out)) == ()  # and the extender will place it
    assert out["metadata"]["labels"]["kai.scheduler/queue"] == "team-a"
    # Nothing the user wrote was changed or dropped: our items are only ever appended.
    before = obj["spec"]["containers"] + obj["spec"].get("initContainers", [])
    after = out["spec"]["containers"] + out["spec"].get("initContainers", [])
    for old, new in zip(before, after, strict=True):
        for key in ("env", "volumeMounts"):
            assert new.get(key, [])[: len(old.get(key, []))] == old.get(key, [])
    assert out["spec"].get("volumes", [])[: len(obj["spec"].get("volumes", []))] == obj["spec"].get(
        "volumes", []
    )
    gpu = _gpu_container(out)
    env = {e["name"]: e for e in gpu["env"]}
    if obj["metadata"]["annotations"].get(names.ISOLATION) == "none":
        assert out["spec"].get("volumes", []) == obj["spec"].get("volumes", [])  # no pipe mount without MPS
        assert decoded(mutate.review(review_of(out), cfg)) == []
        return
    # CUDA_MPS_PIPE_DIRECTORY is where this container mounts the whole host pipe dir.
    pipe_dir = env[names.ENV_MPS_PIPE_DIRECTORY]["value"]
    volumes = {v["name"]: v for v in out["spec"]["volumes"]}
    (mount,) = [m for m in gpu["volumeMounts"] if m["mountPath"] == pipe_dir]
    assert "subPath" not in mount
    assert posixpath.normpath(volumes[mount["name"]]["hostPath"]["path"]) == HOST_DIR
    # A second pass (reinvocation) finds nothing to do.
    assert decoded(mutate.review(review_of(out), cfg)) == []


def test_validator_catches_what_the_issue_reported() -> None:
    """The pod of issue 14 (our mount added beside the user's at the same path) is one the checker refuses."""
    bad = {
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "volumeMounts": [
                        {"name": "nvidia-mps", "mountPath": HOST_DIR},
                        {"name": mutate.MPS_VOLUME, "mountPath": HOST_DIR},
                    ],
                }
            ],
            "volumes": [{"name": "nvidia-mps", "hostPath": {"path": HOST_DIR}}, {"name": mutate.MPS_VOLUME}],
        }
    }
    assert apiserver_errors(bad) == [f"app.volumeMounts.mountPath {HOST_DIR}: must be unique"]


def test_kai_mps_pod_reuses_the_users_mount() -> None:
    obj = {
        "metadata": {"name": "p", "annotations": {names.GPU_FRACTION: "0.5", "mps": "true"}},
        "spec": {
            "containers": [{"name": "app", "volumeMounts": [{"name": "nvidia-mps", "mountPath": HOST_DIR}]}],
            "volumes": [{"name": "nvidia-mps", "hostPath": {"path": HOST_DIR}}],
        },
    }
    out = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings())))
    assert out["spec"]["volumes"] == obj["spec"]["volumes"]
    assert out["spec"]["containers"][0]["volumeMounts"] == obj["spec"]["containers"][0]["volumeMounts"]
    assert {"name": names.ENV_MPS_PIPE_DIRECTORY, "value": HOST_DIR} in out["spec"]["containers"][0]["env"]


def test_other_volume_at_the_pipe_path_is_refused_naming_it() -> None:
    obj = {
        "metadata": {"name": "p", "annotations": {names.GPU_FRACTION: "0.5"}},
        "spec": {
            "containers": [{"name": "app", "volumeMounts": [{"name": "scratch", "mountPath": HOST_DIR}]}],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    }
    decision = decide(review_of(obj), Settings())
    assert decision.outcome is WebhookOutcome.DENIED
    (message,) = decision.messages
    assert message.startswith(
        f"spec.containers[app].volumeMounts[scratch]='{HOST_DIR}': is where gpupack mounts"
    )


def test_our_volume_name_taken_by_another_volume_gets_a_free_name() -> None:
    obj = {
        "metadata": {"name": "p", "annotations": {names.GPU_FRACTION: "0.5"}},
        "spec": {
            "containers": [{"name": "app"}],
            "volumes": [{"name": mutate.MPS_VOLUME, "emptyDir": {}}],
        },
    }
    out = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings())))
    assert out["spec"]["volumes"][0] == {"name": mutate.MPS_VOLUME, "emptyDir": {}}
    assert out["spec"]["volumes"][1]["name"] == f"{mutate.MPS_VOLUME}-2"
    assert out["spec"]["containers"][0]["volumeMounts"] == [
        {"name": f"{mutate.MPS_VOLUME}-2", "mountPath": HOST_DIR}
    ]


def test_pipe_volume_mounted_only_with_a_subpath_gets_a_whole_mount_too() -> None:
    mounts = [{"name": "mps", "mountPath": "/var/run/mps", "subPath": "x"}]
    obj = {
        "metadata": {"name": "p", "annotations": {names.GPU_FRACTION: "0.5"}},
        "spec": {
            "containers": [{"name": "app", "volumeMounts": mounts}],
            "volumes": [{"name": "mps", "hostPath": {"path": HOST_DIR}}],
        },
    }
    out = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings())))
    assert out["spec"]["volumes"] == obj["spec"]["volumes"]
    assert out["spec"]["containers"][0]["volumeMounts"] == [*mounts, {"name": "mps", "mountPath": HOST_DIR}]
