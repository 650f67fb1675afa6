"""The request model: one row per rule, the hostile-input list, and the exact messages users see."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from app.core import names, podview, request
from app.core.errors import RequestError
from app.core.model import Demand
from app.core.podview import ContainerView, Kind, PodView, ask_of
from app.core.request import GpuRequest, Isolation

FRACTION_RULE = "must be a decimal in (0, 1] with at most 2 decimals"
MEMORY_RULE = (
    "must be a whole number of MiB (e.g. 4096) or a Kubernetes quantity with a byte suffix "
    "Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E (e.g. 4Gi)"
)


def Container(  # noqa: N802 - reads as the record it builds
    name: str, init: bool = False, whole_gpus: str | None = None, ours: tuple[tuple[str, str], ...] = ()
) -> ContainerView:
    """A container as the rules read it (only what they read)."""
    return ContainerView(Kind.INIT if init else Kind.REGULAR, 0, name, whole_gpus=whole_gpus, ours=ours)


MAIN = (Container("main"),)


def parse(
    annotations: dict[str, str], containers: Sequence[ContainerView] = MAIN
) -> GpuRequest | tuple[RequestError, ...]:
    return request.parse(PodView(annotations=annotations, containers=tuple(containers)))


def messages(annotations: dict[str, str], containers: Sequence[ContainerView] = MAIN) -> list[str]:
    result = parse(annotations, containers)
    assert isinstance(result, tuple), f"expected errors, got {result}"
    return [str(e) for e in result]


def parsed(annotations: dict[str, str], containers: Sequence[ContainerView] = MAIN) -> GpuRequest:
    result = parse(annotations, containers)
    assert isinstance(result, GpuRequest), f"expected a request, got {result}"
    return result


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param("1.5", f"gpu-fraction='1.5': {FRACTION_RULE}", id="above-one"),
        pytest.param("0", f"gpu-fraction='0': {FRACTION_RULE}", id="zero"),
        pytest.param("-0.5", f"gpu-fraction='-0.5': {FRACTION_RULE}", id="negative"),
        pytest.param("0.125", f"gpu-fraction='0.125': {FRACTION_RULE}", id="three-decimals"),
        pytest.param("NaN", f"gpu-fraction='NaN': {FRACTION_RULE}", id="nan"),
        pytest.param("nan", f"gpu-fraction='nan': {FRACTION_RULE}", id="nan-lower"),
        pytest.param("inf", f"gpu-fraction='inf': {FRACTION_RULE}", id="inf"),
        pytest.param("Infinity", f"gpu-fraction='Infinity': {FRACTION_RULE}", id="infinity"),
        pytest.param("1e-1", f"gpu-fraction='1e-1': {FRACTION_RULE}", id="exponent"),
        pytest.param("0x1", f"gpu-fraction='0x1': {FRACTION_RULE}", id="hex"),
        pytest.param("0x1p-1", f"gpu-fraction='0x1p-1': {FRACTION_RULE}", id="hex-float"),
        pytest.param("0_5", f"gpu-fraction='0_5': {FRACTION_RULE}", id="underscore"),
        pytest.param(" 0.5", f"gpu-fraction=' 0.5': {FRACTION_RULE}", id="leading-space"),
        pytest.param("0.5 ", f"gpu-fraction='0.5 ': {FRACTION_RULE}", id="trailing-space"),
        pytest.param("0.5\n", f"gpu-fraction='0.5\\n': {FRACTION_RULE}", id="trailing-newline"),
        pytest.param("१.५", f"gpu-fraction='१.५': {FRACTION_RULE}", id="non-ascii-digits"),
        pytest.param("", f"gpu-fraction='': {FRACTION_RULE}", id="empty"),
        pytest.param("500m", f"gpu-fraction='500m': {FRACTION_RULE}", id="quantity"),
        pytest.param("half", f"gpu-fraction='half': {FRACTION_RULE}", id="word"),
    ],
)
def test_fraction_rule(raw: str, message: str) -> None:
    assert messages({names.GPU_FRACTION: raw}) == [message]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param("0", "gpu-memory='0': must be more than 0", id="zero"),
        pytest.param("0Gi", "gpu-memory='0Gi': must be more than 0", id="zero-gi"),
        pytest.param("-4096", f"gpu-memory='-4096': {MEMORY_RULE}", id="negative"),
        pytest.param("4096.5", f"gpu-memory='4096.5': {MEMORY_RULE}", id="fractional-mib"),
        pytest.param("nan", f"gpu-memory='nan': {MEMORY_RULE}", id="nan"),
        pytest.param("inf", f"gpu-memory='inf': {MEMORY_RULE}", id="inf"),
        pytest.param("4e3", f"gpu-memory='4e3': {MEMORY_RULE}", id="exponent"),
        pytest.param("0x1000", f"gpu-memory='0x1000': {MEMORY_RULE}", id="hex"),
        pytest.param("4_096", f"gpu-memory='4_096': {MEMORY_RULE}", id="underscore"),
        pytest.param(" 4096", f"gpu-memory=' 4096': {MEMORY_RULE}", id="leading-space"),
        pytest.param("४०९६", f"gpu-memory='४०९६': {MEMORY_RULE}", id="non-ascii-digits"),
        pytest.param("", f"gpu-memory='': {MEMORY_RULE}", id="empty"),
        pytest.param("4GB", f"gpu-memory='4GB': {MEMORY_RULE}", id="gb-suffix"),
        pytest.param("4gi", f"gpu-memory='4gi': {MEMORY_RULE}", id="lowercase-gi"),
        pytest.param("4096000m", f"gpu-memory='4096000m': {MEMORY_RULE}", id="milli-suffix"),
        pytest.param(
            "100Gi",
            "gpu-memory='100Gi': is 102400 MiB, more than any GPU gpupack knows (A100-80GB has 81920 MiB)",
            id="bigger-than-any-gpu",
        ),
    ],
)
def test_memory_rule(raw: str, message: str) -> None:
    assert messages({names.GPU_MEMORY: raw}) == [message]


def test_memory_checked_against_the_listed_models() -> None:
    assert messages({names.GPU_MEMORY: "20Gi", names.GPU_MODEL: "T4|V100M16"}) == [
        "gpu-memory='20Gi': is 20480 MiB, more than any GPU allowed by gpupack.io/gpu-model "
        "(V100M16 has 16160 MiB)"
    ]
    # An unknown model could be bigger, so the limit falls back to the whole catalogue.
    assert parsed({names.GPU_MEMORY: "20Gi", names.GPU_MODEL: "T4|B200"}).memory_mib == 20480


@pytest.mark.parametrize(
    ("annotations", "containers", "expected"),
    [
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.GPU_MEMORY: "4096"},
            MAIN,
            ["gpu-memory='4096': must not be set together with gpu-fraction; use one"],
            id="both-given",
        ),
        pytest.param(
            {names.GPU_FRACTION_NUM_DEVICES: "2"},
            MAIN,
            ["gpu-fraction='': one of gpu-fraction or gpu-memory is required"],
            id="neither-given",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5"},
            (Container("main", whole_gpus="1"),),
            ["gpu-fraction='0.5': must not be combined with nvidia.com/gpu (requested by container 'main')"],
            id="with-nvidia-gpu",
        ),
        pytest.param(
            {names.GPU_MEMORY: "4Gi"},
            (
                Container("main"),
                Container("side", whole_gpus="2"),
                Container("setup", init=True, whole_gpus="1"),
            ),
            [
                "gpu-memory='4Gi': must not be combined with nvidia.com/gpu "
                "(requested by container 'side', 'setup')"
            ],
            id="with-nvidia-gpu-other-and-init-containers",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_NUM_DEVICES: "0"},
            MAIN,
            ["gpu-fraction-num-devices='0': must be an integer from 1 to 16"],
            id="num-devices-zero",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_NUM_DEVICES: "17"},
            MAIN,
            ["gpu-fraction-num-devices='17': must be an integer from 1 to 16"],
            id="num-devices-too-many",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_NUM_DEVICES: "1.5"},
            MAIN,
            ["gpu-fraction-num-devices='1.5': must be an integer from 1 to 16"],
            id="num-devices-decimal",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_NUM_DEVICES: "٢"},
            MAIN,
            ["gpu-fraction-num-devices='٢': must be an integer from 1 to 16"],
            id="num-devices-non-ascii",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_CONTAINER_NAME: "trainr"},
            (Container("main"), Container("sidecar"), Container("trainer", init=True)),
            [
                "gpu-fraction-container-name='trainr': "
                "must name one of the pod's containers or init containers ('main', 'sidecar', 'trainer')"
            ],
            id="container-name-unknown",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5"},
            (),
            ["gpu-fraction-container-name='': the pod has no container to give the GPU to"],
            id="no-containers",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.GPU_MODEL: "T4||A10"},
            MAIN,
            [
                "gpupack.io/gpu-model='T4||A10': "
                "must be a |-separated list of GPU model names with no empty entry"
            ],
            id="model-empty-entry",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.GPU_MODEL: "A100 80GB"},
            MAIN,
            [
                "gpupack.io/gpu-model='A100 80GB': model 'A100 80GB' must be a known GPU model "
                "or a node label value "
                "(at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
            ],
            id="model-not-a-label-value",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.ISOLATION: "MPS"},
            MAIN,
            ["gpupack.io/isolation='MPS': must be one of 'mps', 'none', 'mig'"],
            id="isolation-case",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.ISOLATION: ""},
            MAIN,
            ["gpupack.io/isolation='': must be one of 'mps', 'none', 'mig'"],
            id="isolation-empty",
        ),
    ],
)
def test_rules(annotations: dict[str, str], containers: Sequence[ContainerView], expected: list[str]) -> None:
    assert messages(annotations, containers) == expected


def test_every_error_in_rule_order() -> None:
    """Two (and more) mistakes are all reported at once, in the order the rules run."""
    result = parse(
        {
            names.GPU_FRACTION: "1.5",
            names.GPU_FRACTION_NUM_DEVICES: "0",
            names.GPU_FRACTION_CONTAINER_NAME: "nope",
            names.GPU_MODEL: "|T 4|",
            names.ISOLATION: "full",
        },
        (Container("main", whole_gpus="1"),),
    )
    assert isinstance(result, tuple)
    assert [e.field for e in result] == [
        names.GPU_FRACTION,  # with nvidia.com/gpu
        names.GPU_FRACTION,  # 1.5
        names.GPU_FRACTION_NUM_DEVICES,
        names.GPU_FRACTION_CONTAINER_NAME,
        names.GPU_MODEL,  # empty entries, reported once
        names.GPU_MODEL,  # not a label value
        names.ISOLATION,
    ]
    assert result[1] == RequestError(names.GPU_FRACTION, "1.5", FRACTION_RULE)


def test_fraction_request_defaults() -> None:
    req = parsed({names.GPU_FRACTION: "0.25"}, (Container("main"), Container("sidecar")))
    told = (
        "gpu-fraction-container-name is not set: the GPU goes to the first container, 'main', none to "
        "'sidecar' (set gpu-fraction-container-name to the container that should have it)"
    )
    assert req == GpuRequest(container="main", count=1, milli=250, memory_mib=None, warnings=(told,))
    assert req.isolation is Isolation.MPS
    assert req.resource == (names.RESOURCE_GPU_MILLI, 250)
    assert req.demand() == Demand(count=1, milli=250)


def test_memory_request_with_everything() -> None:
    req = parsed(
        {
            names.GPU_MEMORY: "8Gi",
            names.GPU_FRACTION_NUM_DEVICES: "2",
            names.GPU_FRACTION_CONTAINER_NAME: "trainer",
            names.GPU_MODEL: "V100M32|A100-40GB|V100M32",
            names.ISOLATION: "none",
        },
        (Container("sidecar"), Container("trainer"), Container("setup", init=True)),
    )
    assert req == GpuRequest(
        container="trainer",
        count=2,
        milli=None,
        memory_mib=8192,
        models=("V100M32", "A100-40GB"),
        isolation=Isolation.NONE,
        isolation_explicit=True,
        isolation_written="gpupack.io/isolation=none",
    )
    assert req.resource == (names.RESOURCE_GPU_MEMORY_MIB, 16384)
    assert req.demand() == Demand(
        count=2, memory_mib=8192, models=frozenset({"V100M32", "A100-40GB"}), timeslice=True
    )


def test_rounding_and_alias_are_warned() -> None:
    req = parsed({names.GPU_MEMORY: "500M", names.GPU_MODEL: "Tesla T4|L4"})
    assert req.memory_mib == 477
    assert req.models == ("T4", "L4")
    assert req.warnings == (
        "gpu-memory='500M' is 476.837158203125 MiB; rounded up to 477 MiB",
        "gpupack.io/gpu-model: 'Tesla T4' is read as 'T4'",
    )


def test_explicit_zero_whole_gpus_is_not_a_conflict() -> None:
    assert parsed({names.GPU_FRACTION: "0.5"}, (Container("main", whole_gpus="0"),)).milli == 500


# --- MIG ---

PROFILES = "1g.5gb, 1g.10gb, 2g.10gb, 1g.20gb, 2g.20gb, 3g.20gb, 4g.20gb, 3g.40gb, 4g.40gb, 7g.40gb, 7g.80gb"


def test_a_mig_profile_request_takes_one_device_of_that_profile_without_mps() -> None:
    req = parsed({names.MIG_PROFILE: "1g.10gb"})
    assert (req.mig_profile, req.milli, req.memory_mib, req.isolation) == (
        "1g.10gb",
        None,
        None,
        Isolation.MIG,
    )
    # charged as the least memory a 1g.10gb has on any model (A100-80GB: 9728 MiB)
    assert req.resource == (names.RESOURCE_GPU_MEMORY_MIB, 9728)
    assert req.demand() == Demand(count=1, mig=True, mig_profile="1g.10gb")
    assert ask_of({names.MIG_PROFILE: "1g.10gb"}).wanted


def test_memory_with_mig_isolation_is_a_mig_demand() -> None:
    req = parsed({names.GPU_MEMORY: "15Gi", names.ISOLATION: "mig"})
    assert req.demand() == Demand(count=1, memory_mib=15360, mig=True)
    assert req.resource == (names.RESOURCE_GPU_MEMORY_MIB, 15360)


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param(
            {names.MIG_PROFILE: "1g.9gb"},
            [f"gpupack.io/mig-profile='1g.9gb': must be a MIG profile gpupack knows ({PROFILES})"],
            id="unknown-profile",
        ),
        pytest.param(
            {names.MIG_PROFILE: "1g.10gb", names.GPU_MEMORY: "4Gi"},
            [
                "gpupack.io/mig-profile='1g.10gb': must not be set together with gpu-memory: a MIG device of "
                "a profile is taken whole (for the smallest MIG device with some memory, use gpu-memory with "
                "gpupack.io/isolation: mig)"
            ],
            id="profile-and-memory",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", names.ISOLATION: "mig"},
            [
                "gpupack.io/isolation='mig': needs gpu-memory or gpupack.io/mig-profile, not gpu-fraction: "
                "a MIG device is taken whole, never shared"
            ],
            id="fraction-on-mig",
        ),
        pytest.param(
            {names.MIG_PROFILE: "1g.10gb", names.ISOLATION: "mps"},
            [
                "gpupack.io/isolation='mps': must be 'mig' or absent with gpupack.io/mig-profile: "
                "a MIG device has no MPS"
            ],
            id="profile-with-mps",
        ),
        pytest.param(
            {names.GPU_MEMORY: "80000", names.ISOLATION: "mig"},
            [],
            id="largest-device-fits",
        ),
        pytest.param(
            {names.GPU_MEMORY: "81000", names.ISOLATION: "mig"},
            [
                "gpu-memory='81000': is 81000 MiB, more than any MIG device gpupack knows "
                "(7g.80gb has 80640 MiB)"
            ],
            id="more-than-any-device",
        ),
    ],
)
def test_mig_rules(annotations: dict[str, str], expected: list[str]) -> None:
    result = parse(annotations, MAIN)
    assert ([str(e) for e in result] if isinstance(result, tuple) else []) == expected


# --- burstable: gpupack.io/gpu-memory-limit ---

LIMIT = names.GPU_MEMORY_LIMIT


def test_a_memory_request_with_a_limit_is_burstable_and_placed_by_its_request() -> None:
    req = parsed({names.GPU_MEMORY: "4Gi", LIMIT: "8Gi", names.GPU_FRACTION_NUM_DEVICES: "2"})
    assert (req.memory_mib, req.memory_limit_mib, req.count) == (4096, 8192, 2)
    # Placement and quota count the request; the limit is only the node's hard cap.
    assert req.resource == (names.RESOURCE_GPU_MEMORY_MIB, 8192)
    assert req.demand() == Demand(count=2, memory_mib=4096, memory_limit_mib=8192)


def test_a_limit_equal_to_the_request_and_one_for_a_fraction_are_accepted() -> None:
    assert parsed({names.GPU_MEMORY: "4096", LIMIT: "4Gi"}).memory_limit_mib == 4096
    # 0.25 of the largest GPU gpupack knows (A100-80GB, 81920 MiB) is 20480 MiB.
    req = parsed({names.GPU_FRACTION: "0.25", LIMIT: "20Gi"})
    assert (req.milli, req.memory_limit_mib) == (250, 20480)
    assert parsed({names.GPU_FRACTION: "0.5"}).memory_limit_mib is None


def test_a_limit_is_rounded_up_like_the_request_and_warned() -> None:
    req = parsed({names.GPU_MEMORY: "500M", LIMIT: "1G"})
    assert (req.memory_mib, req.memory_limit_mib) == (477, 954)
    assert req.warnings == (
        "gpu-memory='500M' is 476.837158203125 MiB; rounded up to 477 MiB",
        "gpupack.io/gpu-memory-limit='1G' is 953.67431640625 MiB; rounded up to 954 MiB",
    )


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param(
            {names.GPU_MEMORY: "8Gi", LIMIT: "4Gi"},
            [
                "gpupack.io/gpu-memory-limit='4Gi': is 4096 MiB, less than gpu-memory (8192 MiB): "
                "the limit must be at least the request"
            ],
            id="below-the-request",
        ),
        pytest.param(
            {names.GPU_MEMORY: "8Gi", LIMIT: "20Gi", names.GPU_MODEL: "T4|V100M16"},
            [
                "gpupack.io/gpu-memory-limit='20Gi': is 20480 MiB, more than any GPU allowed by "
                "gpupack.io/gpu-model (V100M16 has 16160 MiB)"
            ],
            id="above-the-gpu",
        ),
        pytest.param(
            {names.GPU_MEMORY: "8Gi", LIMIT: "100Gi"},
            [
                "gpupack.io/gpu-memory-limit='100Gi': is 102400 MiB, more than any GPU gpupack knows "
                "(A100-80GB has 81920 MiB)"
            ],
            id="above-any-gpu",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", LIMIT: "30Gi"},
            [
                "gpupack.io/gpu-memory-limit='30Gi': is 30720 MiB, less than gpu-fraction=0.5 of A100-80GB "
                "(40960 MiB), the largest GPU gpupack knows: the limit must be at least the request on every "
                "GPU the pod may land on (raise it, or narrow the GPUs with gpupack.io/gpu-model)"
            ],
            id="fraction-judged-on-the-largest-gpu",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", LIMIT: "20Gi", names.GPU_MODEL: "A100-40GB|V100M32"},
            [],
            id="fraction-within-the-listed-models",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.75", LIMIT: "20Gi", names.GPU_MODEL: "A100-40GB|V100M32"},
            [
                "gpupack.io/gpu-memory-limit='20Gi': is 20480 MiB, less than gpu-fraction=0.75 of "
                "A100-40GB (30720 MiB), the largest GPU allowed by gpupack.io/gpu-model: the limit must be "
                "at least the request on every GPU the pod may land on (raise it, or narrow the GPUs with "
                "gpupack.io/gpu-model)"
            ],
            id="fraction-judged-on-the-largest-listed-model",
        ),
        pytest.param(
            {names.GPU_MEMORY: "4Gi", LIMIT: "4G8"},
            [f"gpupack.io/gpu-memory-limit='4G8': {MEMORY_RULE}"],
            id="malformed",
        ),
        pytest.param(
            {names.GPU_MEMORY: "4Gi", LIMIT: "0"},
            ["gpupack.io/gpu-memory-limit='0': must be more than 0"],
            id="zero",
        ),
        pytest.param(
            {LIMIT: "8Gi"},
            ["gpu-fraction='': one of gpu-fraction or gpu-memory is required"],
            id="a-limit-alone-has-no-request",
        ),
        pytest.param(
            {names.GPU_MEMORY: "4Gi", LIMIT: "8Gi", names.ISOLATION: "mig"},
            [
                "gpupack.io/gpu-memory-limit='8Gi': must not be set with MIG: a MIG device's memory is "
                "fixed and cannot be borrowed above"
            ],
            id="mig-isolation",
        ),
        pytest.param(
            {names.MIG_PROFILE: "1g.10gb", LIMIT: "10Gi"},
            [
                "gpupack.io/gpu-memory-limit='10Gi': must not be set with MIG: a MIG device's memory is "
                "fixed and cannot be borrowed above"
            ],
            id="mig-profile",
        ),
    ],
)
def test_limit_rules(annotations: dict[str, str], expected: list[str]) -> None:
    result = parse(annotations)
    got = [str(e) for e in result] if isinstance(result, tuple) else []
    assert got == expected


def test_a_limit_alone_asks_for_a_share_so_its_missing_request_is_refused() -> None:
    assert ask_of({LIMIT: "8Gi"}).wanted
    assert ask_of({LIMIT: "8Gi"}).memory_limit == "8Gi"


def test_the_burstable_example_is_a_4gi_request_with_an_8gi_limit() -> None:
    doc = yaml.safe_load((Path(__file__).parents[2] / "deploy/examples/burstable-pod.yaml").read_text())
    req = request.parse(podview.read(doc))
    assert isinstance(req, GpuRequest) and (req.memory_mib, req.memory_limit_mib) == (4096, 8192)


def test_a_pod_like_one_already_judged_is_judged_on_its_own_containers() -> None:
    """Pods of one workload share a verdict; a pod with the same annotations but other containers (a whole
    GPU asked, a gpupack resource elsewhere, another container first, a name missing) gets its own."""
    ask = {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_CONTAINER_NAME: "main"}
    first = parsed(ask)
    assert parsed(ask) == first  # a replica: the same request
    assert messages(ask, (Container("main", whole_gpus="1"),)) == [
        "gpu-fraction='0.5': must not be combined with nvidia.com/gpu (requested by container 'main')"
    ]
    assert parsed(ask) == first  # and the kind already seen is still admitted
    assert parsed(ask, (Container("main"), Container("side"))).container == "main"
    charged = (Container("main"), Container("side", ours=((names.RESOURCE_GPU_MILLI, "100"),)))
    refused = parse(ask, charged)
    assert isinstance(refused, tuple) and [e.field for e in refused] == [names.RESOURCE_GPU_MILLI]
    assert messages(ask, (Container("other"),)) == [
        "gpu-fraction-container-name='main': must name one of the pod's containers or init containers "
        "('other')"
    ]
    unnamed = {names.GPU_FRACTION: "0.5"}
    assert parsed(unnamed, (Container("main"),)).warnings == ()
    assert parsed(unnamed, (Container("log"), Container("main"))).container == "log"
