"""agent.runtime.handlerinstall: the handler's files appear on install and go on uninstall, never under a
running
container, and only an uninstall (the DaemonSet gone or unreadable) removes them."""

from __future__ import annotations

import json
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
