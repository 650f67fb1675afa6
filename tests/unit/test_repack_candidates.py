"""Which pods repack may move, which budgets cover them, which nodes they may land on (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from app.core import names
from app.tools.repack import candidates
from app.tools.repack.selectors import matches, node_allows


def pod(
    name: str = "p",
    *,
    owner: str | None = "ReplicaSet",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "annotations": annotations or {},
        "labels": labels or {},
    }
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "o", "uid": "owner-uid", "controller": True}]
    return {"metadata": meta, "spec": spec or {}}


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({}, ""),
        ({"owner": "StatefulSet"}, ""),
        ({"owner": "Job"}, ""),
        ({"owner": None}, "bare pod: no controller would re-create it"),
        ({"owner": "DaemonSet"}, "owned by a DaemonSet, which does not re-create it elsewhere"),
        ({"annotations": {names.MOVABLE: "false"}}, 'opted out (gpupack.io/movable: "false")'),
        ({"annotations": {names.MOVABLE: " False "}}, 'opted out (gpupack.io/movable: "false")'),
        ({"annotations": {names.MOVABLE: "true"}}, ""),
    ],
    ids=["replicaset", "statefulset", "job", "bare", "daemonset", "opted-out", "opted-out-case", "opted-in"],
)
def test_why_pinned(kwargs: dict[str, Any], why: str) -> None:
    assert candidates.why_pinned(pod(**kwargs)) == why


def test_an_owner_that_is_not_the_controller_does_not_count() -> None:
    p = pod(owner=None)
    p["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "o", "uid": "u"}]
    assert candidates.controller_of(p) is None


def pdb(
    name: str, selector: dict[str, Any], allowed: int, observed: int = 1, ns: str = "ns"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "generation": 1},
        "spec": {"selector": selector},
        "status": {"observedGeneration": observed, "disruptionsAllowed": allowed},
    }


def test_budgets_cover_pods_by_selector_and_namespace() -> None:
    budgets = candidates.budgets_of(
        [
            pdb("web", {"matchLabels": {"app": "web"}}, 1),
            pdb("all", {}, 2),
            pdb("other-ns", {}, 5, ns="elsewhere"),
            pdb("stale", {"matchLabels": {"app": "web"}}, 3, observed=0),
        ]
    )
    assert candidates.budget_map(budgets) == {
        "ns/web": 1,
        "ns/all": 2,
        "elsewhere/other-ns": 5,
        "ns/stale": 0,
    }
    assert candidates.pdbs_covering(pod(labels={"app": "web"}), budgets) == ("ns/all", "ns/stale", "ns/web")
    assert candidates.pdbs_covering(pod(labels={"app": "db"}), budgets) == ("ns/all",)


@pytest.mark.parametrize(
    ("selector", "labels", "want"),
    [
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Sideways"}]}, {"a": "1"}, False),
        ({}, {"anything": "x"}, True),
    ],
    ids=["labels", "labels-differ", "in", "notin-absent", "exists", "doesnotexist", "unknown-op", "empty"],
)
def test_label_selector(selector: dict[str, Any], labels: dict[str, str], want: bool) -> None:
    assert matches(selector, labels) is want


def test_allowed_nodes_follow_selector_affinity_and_cordon() -> None:
    spec = {
        "nodeSelector": {"pool": "a"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": names.NODE_LABEL_GPU_MEMORY_MAX_MIB,
                                    "operator": "Gt",
                                    "values": ["20000"],
                                }
                            ]
                        }
                    ]
                }
            }
        },
    }
    nodes = [
        {"metadata": {"name": "big", "labels": {"pool": "a", names.NODE_LABEL_GPU_MEMORY_MAX_MIB: "40960"}}},
        {
            "metadata": {
                "name": "small",
                "labels": {"pool": "a", names.NODE_LABEL_GPU_MEMORY_MAX_MIB: "16384"},
            }
        },
        {
            "metadata": {
                "name": "other",
                "labels": {"pool": "b", names.NODE_LABEL_GPU_MEMORY_MAX_MIB: "40960"},
            }
        },
        {
            "metadata": {
                "name": "cordoned",
                "labels": {"pool": "a", names.NODE_LABEL_GPU_MEMORY_MAX_MIB: "40960"},
            },
            "spec": {"unschedulable": True},
        },
    ]
    assert candidates.allowed_nodes(pod(spec=spec), nodes) == frozenset({"big"})
    assert node_allows({}, {})


def test_repack_command_refuses_bad_input_before_touching_the_cluster(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main

    assert main(["repack", "--dry-run"]) == 2
    assert "--dry-run only makes sense with --apply" in capsys.readouterr().err
    bad = tmp_path / "plan.json"
    bad.write_text('{"goal": "gpus"}')
    assert main(["repack", "--apply", "--from", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"--from={str(bad)!r}: must be the output of `gpupack repack --plan --json`" in err
    with pytest.raises(SystemExit):
        main(["repack", "--max-evictions", "-1"])
    assert "--max-evictions='-1': must be a whole number >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["explain", "ns/p", "--heartbeat-timeout", "nan"])
    assert "--heartbeat-timeout='nan': must be a number of seconds > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["repack", "--for", "just-a-name"])
    assert "--for='just-a-name': must be NAMESPACE/NAME" in capsys.readouterr().err
    assert main(["repack", "--apply", "--for", "ns/p", "--from", str(bad)]) == 2
    assert "--for plans anew; --from carries out a saved plan" in capsys.readouterr().err
