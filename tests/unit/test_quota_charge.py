"""app.core.quota: the conservative quota charge of every request kind, and reading ResourceQuota objects."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from app.core import catalog, names, podview, quota, request
from app.core.quota import Charge, QuotaUse
from app.core.request import GpuRequest


def parse(annotations: dict[str, str]) -> GpuRequest | tuple[object, ...]:
    return request.parse(
        podview.read({"metadata": {"annotations": annotations}, "spec": {"containers": [{"name": "main"}]}})
    )


def req(annotations: dict[str, str]) -> GpuRequest:
    parsed = parse(annotations)
    assert isinstance(parsed, GpuRequest), parsed
    return parsed


# Expected values worked out by hand from app/core/data/gpu_models.json: the smallest GPU is a T4 (15109 MiB),
# the largest an A100-80GB (81920 MiB); G2 has 20000 MiB, A100-40GB 40960 MiB.
@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param({"gpu-fraction": "0.25"}, Charge(250, 20480), id="fraction-of-the-largest-gpu"),
        pytest.param({"gpu-fraction": "0.5", names.GPU_MODEL: "T4"}, Charge(500, 7554), id="fraction-on-t4"),
        pytest.param(
            {"gpu-fraction": "0.5", names.GPU_MODEL: "T4|A100-40GB"},
            Charge(500, 20480),
            id="fraction-largest-allowed",
        ),
        pytest.param(
            {"gpu-fraction": "0.5", names.GPU_MODEL: "my-gpu"},
            Charge(500, 40960),
            id="fraction-unknown-model",
        ),
        pytest.param(
            {"gpu-fraction": "1", "gpu-fraction-num-devices": "2"}, Charge(2000, 163840), id="two-whole"
        ),
        pytest.param({"gpu-memory": "8Gi"}, Charge(543, 8192), id="memory-on-the-smallest-gpu-holding-it"),
        pytest.param(
            {"gpu-memory": "20480", names.GPU_MODEL: "A100-40GB"},
            Charge(500, 20480),
            id="memory-half-an-a100",
        ),
        pytest.param({"gpu-memory": "20000"}, Charge(1000, 20000), id="memory-filling-a-g2"),
        pytest.param(
            {"gpu-memory": "4096", names.GPU_MODEL: "my-gpu"},
            Charge(1000, 4096),
            id="memory-unknown-model-whole",
        ),
        pytest.param(
            {"gpu-memory": "10Gi", "gpu-fraction-num-devices": "3", names.GPU_MODEL: "A100-40GB|A100-80GB"},
            Charge(750, 30720),
            id="memory-three-devices",
        ),
    ],
)
def test_charge(annotations: dict[str, str], expected: Charge) -> None:
    assert quota.charge(req(annotations)) == expected


A100_FLEET = quota.Fleet({"A100-40GB": 40960})
MIXED_FLEET = quota.Fleet({"A100-40GB": 40960, "T4": 15109, "my-gpu": 24576})


@pytest.mark.parametrize(
    ("annotations", "fleet", "expected"),
    [
        pytest.param({"gpu-fraction": "0.5"}, A100_FLEET, Charge(500, 20480), id="half-of-the-clusters-a100"),
        pytest.param(
            {"gpu-fraction": "0.5"}, MIXED_FLEET, Charge(500, 20480), id="half-of-the-largest-in-the-fleet"
        ),
        pytest.param(
            {"gpu-fraction": "0.5", names.GPU_MODEL: "T4|my-gpu"},
            MIXED_FLEET,
            Charge(500, 12288),
            id="largest-allowed-in-the-fleet-catalogue-or-not",
        ),
        pytest.param(
            {"gpu-fraction": "0.5", names.GPU_MODEL: "H100-80GB"},
            A100_FLEET,
            Charge(500, 40779),  # half of the catalogue's H100-80GB (81559 MiB)
            id="allowed-model-not-in-the-fleet-falls-back-to-the-catalogue",
        ),
        pytest.param(
            {"gpu-fraction": "0.25"},
            quota.Fleet(fallback_memory_mib=24576),
            Charge(250, 6144),
            id="no-fleet-known-the-fallback-memory",
        ),
        pytest.param(
            {"gpu-fraction": "0.5", names.GPU_MODEL: "T4"},
            quota.Fleet(fallback_memory_mib=24576),
            Charge(500, 7554),
            id="a-named-catalogue-model-beats-the-fallback",
        ),
        pytest.param(
            {"gpu-memory": "8Gi"}, MIXED_FLEET, Charge(543, 8192), id="memory-on-the-smallest-fleet-gpu"
        ),
        pytest.param(
            {"gpu-memory": "8Gi"}, A100_FLEET, Charge(200, 8192), id="memory-on-the-only-fleet-model"
        ),
        pytest.param(
            {"gpu-memory": "48Gi"}, MIXED_FLEET, Charge(1000, 49152), id="memory-no-fleet-gpu-holds-it"
        ),
    ],
)
def test_charge_from_the_gpus_the_cluster_has(
    annotations: dict[str, str], fleet: quota.Fleet, expected: Charge
) -> None:
    assert quota.charge(req(annotations), fleet) == expected


def test_a_request_kind_not_charged_yet_counts_whole_gpus() -> None:
    """Neither a fraction, a memory request nor a MIG profile: a whole GPU of the largest model it may land
    on per device, never nothing."""
    unknown_kind = GpuRequest(container="main", count=2, milli=None, memory_mib=None)
    assert quota.charge(unknown_kind) == Charge(2000, 163840)
    on_t4 = GpuRequest(container="main", count=1, milli=None, memory_mib=None, models=("T4",))
    assert quota.charge(on_t4) == Charge(1000, 15109)


@pytest.mark.parametrize(
    ("profile", "models", "expected"),
    [
        pytest.param("1g.10gb", (), "1g", id="1g-any-model"),
        pytest.param("3g.40gb", (), "3g", id="3g-any-model"),
        pytest.param("1g.10gb", ("A100-80GB",), "1g", id="1g-on-a100-80"),
    ],
)
def test_a_mig_profile_is_charged_its_slices_and_its_largest_memory(
    profile: str, models: tuple[str, ...], expected: str
) -> None:
    """A whole MIG device: compute slices of 7 as GPU share (rounded up), the profile's memory on the
    largest candidate model that offers it (what the pod may get)."""
    req_ = GpuRequest(
        container="main", count=1, milli=None, memory_mib=None, mig_profile=profile, models=models
    )
    table = catalog.models()
    candidates = [table[m] for m in models] if models else list(table.values())
    sizes = [p.memory_mib for g in candidates if (p := g.mig_profile(profile)) is not None]
    slices = int(expected.removesuffix("g"))
    got = quota.charge(req_)
    assert got.milli == -(-slices * 1000 // 7)
    assert got.memory_mib == max(sizes)
    assert got.memory_mib >= catalog.mig_profile_memory(profile)


def test_charge_names_the_quota_resources() -> None:
    assert Charge(250, 20480).resources() == {
        "gpupack.io/quota-gpu-milli": 250,
        "gpupack.io/quota-gpu-memory-mib": 20480,
    }


MODELS = sorted(catalog.models())


@given(
    kind=st.sampled_from(["fraction", "memory"]),
    amount=st.integers(1, 100),
    count=st.integers(1, 4),
    allowed=st.lists(st.sampled_from(MODELS), max_size=3, unique=True),
)
def test_charge_covers_what_placement_reserves_on_any_gpu_the_pod_may_land_on(
    kind: str, amount: int, count: int, allowed: list[str]
) -> None:
    """The invariant that makes the charge conservative: on every allowed GPU that fits the request,
    the share and memory placement reserves (model.Demand.on) are at most what the quota counts."""
    annotations = {"gpu-fraction-num-devices": str(count)}
    if kind == "fraction":
        annotations["gpu-fraction"] = f"0.{amount:02d}" if amount < 100 else "1"
    else:
        annotations["gpu-memory"] = str(amount * 800)
    if allowed:
        annotations[names.GPU_MODEL] = "|".join(allowed)
    parsed = parse(annotations)
    if not isinstance(parsed, GpuRequest):  # e.g. more memory than any allowed GPU has
        return
    charged = quota.charge(parsed)
    demand = parsed.demand()
    for model in allowed or MODELS:
        total = catalog.models()[model].memory_mib
        milli, mib = demand.on(total)
        if milli > 1000 or mib > total:
            continue  # placement never puts it there
        assert milli * count <= charged.milli
        assert mib * count <= charged.memory_mib


def rq(
    namespace: str, name: str, hard: dict[str, str], used: dict[str, str] | None = None
) -> dict[str, object]:
    status = {} if used is None else {"hard": hard, "used": used}
    return {"metadata": {"namespace": namespace, "name": name}, "spec": {"hard": hard}, "status": status}


def test_uses_reads_gpupack_resources_only_in_order() -> None:
    quotas = [
        rq(
            "team-b",
            "gpu",
            {"requests.gpupack.io/quota-gpu-milli": "2k"},
            {"requests.gpupack.io/quota-gpu-milli": "500"},
        ),
        rq(
            "team-a",
            "mixed",
            {"pods": "10", "requests.gpupack.io/quota-gpu-memory-mib": "80Ki", "requests.cpu": "4"},
            {"pods": "3", "requests.gpupack.io/quota-gpu-memory-mib": "40960", "requests.cpu": "1"},
        ),
        rq("team-c", "new", {"requests.gpupack.io/gpu-milli": "1000"}),  # status not computed yet
    ]
    assert quota.uses(quotas) == [
        QuotaUse(
            "team-a", "mixed", "requests.gpupack.io/quota-gpu-memory-mib", Fraction(40960), Fraction(81920)
        ),
        QuotaUse("team-b", "gpu", "requests.gpupack.io/quota-gpu-milli", Fraction(500), Fraction(2000)),
        QuotaUse("team-c", "new", "requests.gpupack.io/gpu-milli", Fraction(0), Fraction(1000)),
    ]
    assert [u.ratio for u in quota.uses(quotas)] == [0.5, 0.25, 0.0]


def test_a_zero_quota_reads_full_once_used() -> None:
    (use,) = quota.uses([rq("ns", "q", {"requests.gpupack.io/quota-gpu-milli": "0"}, {})])
    assert use.ratio == 0.0
    assert QuotaUse("ns", "q", "r", Fraction(1), Fraction(0)).ratio == 1.0


def test_example_quota_caps_both_quota_resources() -> None:
    doc = yaml.safe_load((Path(__file__).parents[2] / "deploy/examples/gpu-quota.yaml").read_text())
    assert doc["kind"] == "ResourceQuota"
    (use_share, use_memory) = quota.uses([{**doc, "metadata": {"namespace": "ns", "name": "gpu"}}])[::-1]
    assert use_share.resource == quota.QUOTA_PREFIX + names.RESOURCE_QUOTA_GPU_MILLI
    assert use_memory.resource == quota.QUOTA_PREFIX + names.RESOURCE_QUOTA_GPU_MEMORY_MIB
    assert (use_share.hard, use_memory.hard) == (1000, 40960)
