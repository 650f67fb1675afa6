"""Every gpupack pod tells Karpenter and cluster-autoscaler not to evict it on their own guess."""

from __future__ import annotations

import pytest

from tests.unit.test_webhook_mutate import apply_patch
from webhook import disruption

WANT = {"karpenter.sh/do-not-disrupt": "true", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}


def applied(meta: dict[str, object]) -> dict[str, object]:
    pod = {"metadata": meta}
    have = meta.get("annotations") or {}
    assert isinstance(have, dict)
    return apply_patch(pod, disruption.annotation_ops(have))["metadata"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("meta", [{}, {"annotations": {}}, {"annotations": {"gpu-fraction": "0.5"}}])
def test_both_annotations_added(meta: dict[str, object]) -> None:
    got = applied(meta)["annotations"]
    assert isinstance(got, dict) and WANT.items() <= got.items()


def test_the_owners_value_is_kept_and_a_second_pass_adds_nothing() -> None:
    meta = {"annotations": {"karpenter.sh/do-not-disrupt": "30m"}}
    got = applied(meta)["annotations"]
    assert got == {
        "karpenter.sh/do-not-disrupt": "30m",
        "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
    }
    assert disruption.annotation_ops(got) == []
