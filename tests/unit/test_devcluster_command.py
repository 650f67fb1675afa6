"""`python -m tests.devcluster`: argument handling that needs no cluster (unknown model, empty directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core import catalog
from tests.devcluster import command
from tests.devcluster.command import main
from tests.devcluster.processes import HealthCheck, ManagedProcess


def test_unknown_model_is_one_line_listing_known_models_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["up", "--dir", str(tmp_path), "--gpu-model", "H200-999GB"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("python -m tests.devcluster up: unknown GPU model 'H200-999GB'; known: ")
    assert all(name in err for name in catalog.models())
    assert list(tmp_path.iterdir()) == []  # nothing was started or written


@pytest.mark.parametrize("flag", ["--nodes", "--gpus-per-node"])
@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_counts_must_be_positive_integers(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["up", flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}: " in capsys.readouterr().err


def test_status_without_a_cluster_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out == f"no dev cluster in {tmp_path}\n"


def test_down_without_a_cluster_is_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["down", "--dir", str(tmp_path)]) == 0
    assert "nothing to stop" in capsys.readouterr().out


def test_bad_binaries_dir_is_named_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUPACK_K8S_BIN", str(tmp_path / "nope"))
    assert main(["up", "--dir", str(tmp_path / "dev")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"python -m tests.devcluster up: GPUPACK_K8S_BIN={tmp_path / 'nope'}: missing executables: "
        "etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok"
    )


def test_an_impossible_mig_layout_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["up", "--dir", str(tmp_path), "--gpu-model", "A100-80GB", "--mig", "3g.40gb,7g.80gb"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    rule = "must name 1 to 7 compute slices of MIG devices: names 10"
    assert err == f"python -m tests.devcluster up: --mig='3g.40gb,7g.80gb': {rule}\n"
    assert list(tmp_path.iterdir()) == []


def test_every_gpupack_component_has_its_metrics_url() -> None:
    """The dev cluster picks free ports: `dev up` and `dev status` print where each /metrics is."""

    def proc(name: str, url: str | None) -> ManagedProcess:
        return ManagedProcess(name, 1, 0, "log", ("x",), HealthCheck(url) if url else None)

    processes = [
        proc("kube-apiserver", "https://127.0.0.1:6443/readyz"),
        proc("gpupack-extender", "http://127.0.0.1:41001/readyz"),
        proc("gpupack-webhook", "https://127.0.0.1:41002/readyz"),
        proc("gpupack-agent-gpu-node-0", "http://127.0.0.1:41003/healthz"),
        proc("no-health", None),
    ]
    assert command.metrics_urls(processes) == [
        ("gpupack-extender", "http://127.0.0.1:41001/metrics"),
        ("gpupack-webhook", "https://127.0.0.1:41002/metrics"),
        ("gpupack-agent-gpu-node-0", "http://127.0.0.1:41003/metrics"),
    ]
