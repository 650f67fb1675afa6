"""Find (or build, via tests/k8s/build.sh) the control-plane binaries: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and kwok."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import IO

BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok")
ENV_BIN = "GPUPACK_K8S_BIN"


class BinariesError(RuntimeError):
    """The binaries are missing and could not be built; the message says what to do."""


def repo_root() -> Path | None:
    """The source checkout this package runs from, if it does (an editable install or a plain checkout)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "tests" / "k8s" / "build.sh").is_file() else None


def check_dir(bin_dir: Path) -> Path:
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        raise BinariesError(f"{bin_dir}: missing executables: {', '.join(missing)}")
    return bin_dir


def ensure_binaries(progress: IO[str] | None = None) -> Path:
    """The directory holding the control-plane binaries (BINARIES).

    $GPUPACK_K8S_BIN wins. Otherwise run the checkout's tests/k8s/build.sh, which returns at once when its
    cache is warm and builds from the Go module proxy when cold (minutes). Its progress goes to `progress`
    (None: captured, and quoted in the error if the build fails).
    """
    if os.environ.get(ENV_BIN):
        try:
            return check_dir(Path(os.environ[ENV_BIN]))
        except BinariesError as exc:
            raise BinariesError(f"{ENV_BIN}={exc}") from None
    root = repo_root()
    if root is None:
        raise BinariesError(
            f"no Kubernetes binaries: set {ENV_BIN} to a directory with {', '.join(BINARIES)} "
            "(gpupack is not running from a source checkout, so tests/k8s/build.sh is not available)"
        )
    script = root / "tests" / "k8s" / "build.sh"
    proc = subprocess.run(
        ["bash", str(script)],
        stdout=subprocess.PIPE,
        stderr=progress if progress is not None else subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        detail = "\n".join((proc.stderr or "").splitlines()[-30:])
        raise BinariesError(
            f"{script} failed (exit {proc.returncode}); it needs Go >= 1.26 and the Go module proxy\n{detail}"
        )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise BinariesError(f"{script} printed no bin dir")
    return check_dir(Path(lines[-1]))
