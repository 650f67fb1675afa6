"""agent.runtime.handlerinstall: the handler's files appear on install and go on uninstall, never under a
running container, and only an uninstall (the DaemonSet gone or unreadable) removes them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agent.runtime import handlerinstall as hi
from app.core.errors import KubeError
from app.kube.calls import Request


@pytest.fixture
def files(tmp_path: Path) -> hi.HandlerFiles:
    return hi.HandlerFiles(tmp_path / "bin", "runc", tmp_path / "state" / "agent.sock", tmp_path / "state")


def test_install_puts_an_executable_copy_and_its_config(files: hi.HandlerFiles, tmp_path: Path) -> None:
    source = tmp_path / "gpupack-runc"
    source.write_bytes(b"\x7fELF v1")
    hi.install(files, source)
    assert files.binary.read_bytes() == b"\x7fELF v1"
    assert files.binary.stat().st_mode & 0o777 == 0o755
    assert json.loads(files.config.read_text()) == {
        "runtime": "runc",
        "socket": str(files.socket),
        "state_dir": str(files.state_dir),
        "timeout_s": 10.0,
    }
    source.write_bytes(b"\x7fELF v2")  # a rollout's new image
    hi.install(files, source)
    assert files.binary.read_bytes() == b"\x7fELF v2"
    assert sorted(p.name for p in files.install_dir.iterdir()) == ["gpupack-runc", "gpupack-runc.json"]


def test_uninstall_removes_everything_it_installed(files: hi.HandlerFiles, tmp_path: Path) -> None:
    source = tmp_path / "gpupack-runc"
    source.write_bytes(b"bin")
    hi.install(files, source)
    assert hi.uninstall(files)
    assert not files.install_dir.exists()


def test_uninstall_leaves_the_handler_while_a_container_runs_under_it(
    files: hi.HandlerFiles, tmp_path: Path
) -> None:
    source = tmp_path / "gpupack-runc"
    source.write_bytes(b"bin")
    hi.install(files, source)
    record = files.state_dir / "containers" / "c1.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"namespace": "team-a", "pod": "half", "container_id": "c1"}))
    assert hi.in_use(files) == ["team-a/half c1"]
    assert not hi.uninstall(files)
    assert files.binary.exists() and files.config.exists()


def sender(answer: dict[str, Any] | KubeError) -> Any:
    def send(req: Request) -> dict[str, Any]:
        assert req.path == "/apis/apps/v1/namespaces/gpupack-system/daemonsets/gpupack-agent"
        if isinstance(answer, KubeError):
            raise answer
        return answer

    return send


@pytest.mark.parametrize(
    ("answer", "gone"),
    [
        ({"metadata": {"name": "gpupack-agent"}}, False),  # a rollout
        ({"metadata": {"deletionTimestamp": "2026-11-25T00:00:00Z"}}, True),
        (KubeError(404, "NotFound", "gone"), True),
        (KubeError(403, "Forbidden", "the release's RBAC is gone"), True),
        (KubeError(401, "Unauthorized", "the ServiceAccount is gone"), True),
        (KubeError(0, "", "apiserver unreachable"), False),  # unsure: keep the handler
        (KubeError(500, "InternalError", "etcd"), False),
    ],
    ids=["present", "deleting", "404", "403", "401", "unreachable", "500"],
)
def test_only_a_deleted_daemonset_means_uninstall(answer: dict[str, Any] | KubeError, gone: bool) -> None:
    assert hi.release_gone(sender(answer), "gpupack-system", "gpupack-agent") is gone


@pytest.fixture
def guard(tmp_path: Path) -> hi.GuardFiles:
    """A node prepared for the guard: containerd's default runtime path links to the node's runc."""
    runc = tmp_path / "usr" / "sbin" / "runc"
    runc.parent.mkdir(parents=True)
    runc.write_bytes(b"runc")
    install = tmp_path / "bin"
    install.mkdir()
    (install / hi.GUARD_BINARY).symlink_to(runc)
    exempt = ("gpupack-system", "gpu-operator")
    return hi.GuardFiles(install, tmp_path / "state", exempt, ("monitoring/dcgm-",))


def _source(tmp_path: Path) -> Path:
    source = tmp_path / "gpupack-runc"
    source.write_bytes(b"\x7fELF guard")
    return source


def test_guard_takes_the_default_runtimes_place_and_runs_the_previous_one(
    guard: hi.GuardFiles, tmp_path: Path
) -> None:
    runc = str(tmp_path / "usr" / "sbin" / "runc")
    assert hi.install_guard(guard, _source(tmp_path)) == ""
    assert not guard.binary.is_symlink() and guard.binary.read_bytes() == b"\x7fELF guard"
    assert guard.binary.stat().st_mode & 0o777 == 0o755
    assert json.loads(guard.config.read_text()) == {
        "runtime": runc,
        "state_dir": str(guard.state_dir),
        "exempt_namespaces": ["gpupack-system", "gpu-operator"],
        "exempt_pods": ["monitoring/dcgm-"],
        "allocation_annotation": "gpupack.io/gpu-uuids",
        "env": {"NVIDIA_VISIBLE_DEVICES": "void"},
        "unset": [
            "NVIDIA_GPU_MEMORY_REQUEST",
            "NVIDIA_GPU_MEMORY_LIMIT",
            "NVIDIA_GPU_MEMORY_REQUESTS",
            "NVIDIA_GPU_MEMORY_LIMITS",
        ],
    }
    assert os.readlink(guard.previous) == runc


def test_a_rollout_keeps_the_node_s_previous_runtime(guard: hi.GuardFiles, tmp_path: Path) -> None:
    runc = str(tmp_path / "usr" / "sbin" / "runc")
    hi.install_guard(guard, _source(tmp_path))
    newer = tmp_path / "newer"
    newer.write_bytes(b"\x7fELF guard v2")
    changed = hi.GuardFiles(guard.install_dir, guard.state_dir, ("gpupack-system",), ())
    assert hi.install_guard(changed, newer) == ""  # the path is the guard now, not the link
    assert guard.binary.read_bytes() == b"\x7fELF guard v2"
    config = json.loads(guard.config.read_text())
    assert config["runtime"] == runc and config["exempt_namespaces"] == ["gpupack-system"]
    assert config["exempt_pods"] == []


def test_uninstall_puts_the_previous_default_runtime_back(guard: hi.GuardFiles, tmp_path: Path) -> None:
    runc = str(tmp_path / "usr" / "sbin" / "runc")
    hi.install_guard(guard, _source(tmp_path))
    record = guard.state_dir / "guarded" / "c1.json"
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    assert hi.uninstall_guard(guard)
    assert guard.binary.is_symlink() and os.readlink(guard.binary) == runc
    assert guard.binary.read_bytes() == b"runc"  # what containerd runs is runc again
    assert sorted(p.name for p in guard.install_dir.iterdir()) == [hi.GUARD_BINARY]
    assert not record.parent.exists()
    assert not hi.uninstall_guard(guard)  # twice: nothing more to restore
    assert os.readlink(guard.binary) == runc
    assert hi.install_guard(guard, _source(tmp_path)) == ""  # and a later install finds the node prepared


def test_uninstall_of_the_whole_node_side_leaves_only_the_restored_link(
    guard: hi.GuardFiles, files: hi.HandlerFiles, tmp_path: Path
) -> None:
    source = _source(tmp_path)
    hi.install(files, source)
    hi.install_guard(guard, source)
    assert hi.uninstall_guard(guard) and hi.uninstall(files)
    assert sorted(p.name for p in files.install_dir.iterdir()) == [hi.GUARD_BINARY]


def test_a_relative_link_is_read_from_the_install_dir(tmp_path: Path) -> None:
    install = tmp_path / "bin"
    install.mkdir()
    (install / "runc").write_bytes(b"runc")
    (install / hi.GUARD_BINARY).symlink_to("runc")
    guard = hi.GuardFiles(install, tmp_path / "state")
    assert hi.install_guard(guard, _source(tmp_path)) == ""
    assert json.loads(guard.config.read_text())["runtime"] == str(install / "runc")


@pytest.mark.parametrize(
    ("prepare", "says"),
    [
        (lambda install: None, "does not exist: this node is not prepared for the guard"),
        (lambda install: (install / hi.GUARD_BINARY).write_bytes(b"x"), "is a file, not a link"),
        (lambda install: (install / hi.GUARD_BINARY).symlink_to(install / "gpupack-runc"), "gpupack's own"),
    ],
    ids=["missing", "a file", "a link to gpupack-runc"],
)
def test_a_node_not_prepared_for_the_guard_is_left_as_it_is(tmp_path: Path, prepare: Any, says: str) -> None:
    install = tmp_path / "bin"
    install.mkdir()
    prepare(install)
    before = sorted(p.name for p in install.iterdir())
    guard = hi.GuardFiles(install, tmp_path / "state")
    assert says in hi.install_guard(guard, _source(tmp_path))
    assert sorted(p.name for p in install.iterdir()) == before
    assert not hi.uninstall_guard(guard)


def test_exemptions_are_checked_and_each_problem_named() -> None:
    assert hi.exemption_problems(("gpu-operator", "kube-system"), ("monitoring/dcgm-exporter-",)) == []
    problems = hi.exemption_problems(("GPU_Operator",), ("monitoring", "monitoring/", "Bad/x"))
    assert problems == [
        "--exempt-namespace='GPU_Operator': must be a namespace name (a DNS-1123 label: lowercase letters, "
        "digits and '-', at most 63 characters)",
        "--exempt-pod='monitoring': must be <namespace>/<pod name prefix>, e.g. monitoring/dcgm-exporter-",
        "--exempt-pod='monitoring/': must be <namespace>/<pod name prefix>, e.g. monitoring/dcgm-exporter-",
        "--exempt-pod='Bad/x': must be <namespace>/<pod name prefix>, e.g. monitoring/dcgm-exporter-",
    ]
