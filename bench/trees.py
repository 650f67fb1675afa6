"""This tree and an earlier commit, for the benches that measure the two in turn."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def commit_of(rev: str) -> str:
    """The full commit id of `rev` (a commit, tag or branch of this repository)."""
    return subprocess.run(
        ["git", "rev-parse", rev], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()


def uncommitted(*paths: str) -> bool:
    """Whether this tree has uncommitted changes under `paths` (what a run's "new" side then measures)."""
    out = subprocess.run(
        ["git", "status", "--porcelain", "--", *paths], cwd=REPO, capture_output=True, text=True, check=True
    )
    return bool(out.stdout)


@contextmanager
def unpacked(commit: str, prefix: str) -> Iterator[Path]:
    """`commit`'s files (`git archive`) in a temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        yield Path(tmp)
