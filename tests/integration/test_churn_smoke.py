"""Three minutes of churn (bench/churn.py, the hour-long bench cut short): 10 GPU pods created and deleted a
second against the dev cluster. Asserts leaks and errors only; the timings and memory slopes are the bench's
to report (bench/results/churn.json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_three_minutes_of_churn_leak_nothing_and_bind_every_pod(tmp_path: Path) -> None:
    out = tmp_path / "churn.json"
    argv = [sys.executable, str(REPO / "bench/churn.py"), "--seconds", "180", "--out", str(out)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert out.exists(), done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["pods_created"] >= 1000, result  # the load was offered (10 a second for 180 s)
    assert result["error_count"] == 0, result["errors"]
    assert result["unbound_or_late"] == 0
    assert result["left_after_last_delete"] == {
        "gpus_with_allocation": 0, "pods_on_gpus": 0, "holds": 0, "pending": 0,
    }  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
