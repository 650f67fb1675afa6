"""gpupack top's quota view: a namespace's GPU quota use, from ResourceQuota objects."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from app.core.errors import KubeError
from app.core.quota import QuotaUse
from app.kube import calls
from app.tools import top

MILLI = "requests.gpupack.io/quota-gpu-milli"
MEMORY = "requests.gpupack.io/quota-gpu-memory-mib"


def test_render_quota_shows_gpus_and_mib_against_the_hard_limit() -> None:
    uses = [
        QuotaUse("team-a", "gpu", MEMORY, Fraction(20480), Fraction(81920)),
        QuotaUse("team-a", "gpu", MILLI, Fraction(1500), Fraction(2000)),
        QuotaUse("team-b", "over", MILLI, Fraction(1200), Fraction(1000)),  # quota lowered below use
    ]
    lines = top.render_quota(uses, None).splitlines()
    assert lines[1].split() == [
        "team-a",
        "gpu",
        MEMORY,
        "[#####---------------]",
        "20480/81920",
        "MiB",
        "25%",
    ]
    assert lines[2].split() == ["team-a", "gpu", MILLI, "[###############-----]", "1.50/2.00", "GPUs", "75%"]
    assert lines[3].split() == [
        "team-b",
        "over",
        MILLI,
        "[####################]!",
        "1.20/1.00",
        "GPUs",
        "120%",
    ]


def test_render_quota_says_when_nothing_is_capped() -> None:
    assert top.render_quota([], "team-a") == "no ResourceQuota on gpupack.io/* resources in namespace team-a"


class OnePage:
    """A KubeApi answering every list with the given items, recording the paths it was asked for."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.paths: list[str] = []

    def send(self, request: calls.Request) -> Any:
        self.paths.append(request.path)
        return {"items": self.items, "metadata": {}}


def test_quota_view_lists_the_namespaces_quotas_only() -> None:
    item = {
        "metadata": {"namespace": "team-a", "name": "gpu"},
        "spec": {"hard": {MILLI: "1k", "pods": "10"}},
        "status": {"hard": {MILLI: "1k", "pods": "10"}, "used": {MILLI: "500", "pods": "1"}},
    }
    kube = OnePage([item])
    text = top.quota_view(kube, "team-a")  # type: ignore[arg-type]
    assert kube.paths == ["/api/v1/namespaces/team-a/resourcequotas"]
    assert "0.50/1.00 GPUs" in text and "pods" not in text.split("\n", 1)[1]
    top.quota_view(kube, None)  # type: ignore[arg-type]
    assert kube.paths[-1] == "/api/v1/resourcequotas"


class Refusing:
    def __init__(self, code: int) -> None:
        self.code = code

    def send(self, request: calls.Request) -> Any:
        raise KubeError(self.code, "Forbidden", f"cannot list resource {request.path!r}")


def test_quota_view_without_the_right_to_list_quotas_says_so() -> None:
    text = top.quota_view(Refusing(403), "team-a")  # type: ignore[arg-type]
    assert text == "GPU quota not shown: cannot list resource '/api/v1/namespaces/team-a/resourcequotas'"
    with pytest.raises(KubeError):
        top.quota_view(Refusing(500), "team-a")  # type: ignore[arg-type]
