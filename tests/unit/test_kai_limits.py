"""KAI-Scheduler 0.18's limits read with KAI's meaning: gpu-fraction.limit, gpu-memory.limit and the
per-container kai.scheduler/container.<c>.gpu-memory.portion.limit; and the hard cap they give on a GPU."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import pytest

from app.core import names, request
from app.core.errors import RequestError
from app.core.model import Demand, Gpu, Node
from app.core.placement.place import to_allocation
from app.core.podview import ContainerView, Kind, PodView, ask_of
from app.core.request import GpuRequest

FRACTION_LIMIT = names.KAI_FRACTION_LIMIT
MEMORY_LIMIT = names.KAI_GPU_MEMORY_LIMIT
PORTION_MAIN = "kai.scheduler/container.main.gpu-memory.portion.limit"
PORTION_SIDE = "kai.scheduler/container.side.gpu-memory.portion.limit"
CONTAINERS = (ContainerView(Kind.REGULAR, 0, "main"), ContainerView(Kind.REGULAR, 1, "side"))
SHARE_RULE = "must be a decimal in (0, 1] with at most 5 decimals (a share of each GPU's memory)"


def parse(annotations: dict[str, str], containers: Sequence[ContainerView] = CONTAINERS) -> object:
    return request.parse(PodView(annotations=annotations, containers=tuple(containers)))


def errors(annotations: dict[str, str]) -> list[str]:
    result = parse(annotations)
    return [str(e) for e in result] if isinstance(result, tuple) else []


def parsed(annotations: dict[str, str]) -> GpuRequest:
    result = parse(annotations)
    assert isinstance(result, GpuRequest), f"expected a request, got {result}"
    return result


def test_gpu_memory_limit_is_the_memory_cap_of_a_gpu_memory_pod() -> None:
    req = parsed({names.GPU_MEMORY: "4096", MEMORY_LIMIT: "8Gi"})
    assert (req.memory_mib, req.memory_limit_mib, req.memory_limit_share) == (4096, 8192, None)
    # Placement and quota count the request; the limit is the node's hard cap.
    assert req.resource == (names.RESOURCE_GPU_MEMORY_MIB, 4096)
    assert req.demand() == Demand(count=1, memory_mib=4096, memory_limit_mib=8192)


@pytest.mark.parametrize("key", [FRACTION_LIMIT, PORTION_MAIN])
def test_a_fraction_limit_is_a_share_of_each_gpus_memory(key: str) -> None:
    req = parsed({names.GPU_FRACTION: "0.5", key: "0.75"})
    assert (req.milli, req.memory_limit_mib, req.memory_limit_share) == (500, None, Fraction(3, 4))
    assert req.burstable
    assert req.resource == (names.RESOURCE_GPU_MILLI, 500)


def test_both_spellings_of_the_fraction_limit_may_stand_together_when_they_agree() -> None:
    req = parsed({names.GPU_FRACTION: "0.5", FRACTION_LIMIT: "0.8", PORTION_MAIN: "0.80"})
    assert req.memory_limit_share == Fraction(4, 5)


def test_the_portion_limit_follows_the_named_gpu_container() -> None:
    annotations = {names.GPU_FRACTION: "0.25", names.GPU_FRACTION_CONTAINER_NAME: "side", PORTION_SIDE: "0.5"}
    req = parsed(annotations)
    assert (req.container, req.memory_limit_share) == ("side", Fraction(1, 2))


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param(
            {names.GPU_MEMORY: "8Gi", MEMORY_LIMIT: "4Gi"},
            [
                "gpu-memory.limit='4Gi': is 4096 MiB, less than gpu-memory (8192 MiB): the limit must be at "
                "least the request"
            ],
            id="memory-limit-below-request",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", FRACTION_LIMIT: "0.3"},
            [
                "gpu-fraction.limit='0.3': is less than gpu-fraction=0.5: the limit must be at least the "
                "request"
            ],
            id="fraction-limit-below-request",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", PORTION_MAIN: "0.25"},
            [f"{PORTION_MAIN}='0.25': is less than gpu-fraction=0.5: the limit must be at least the request"],
            id="portion-limit-below-request",
        ),
        pytest.param(
            {names.GPU_MEMORY: "4096", MEMORY_LIMIT: "8192"},
            [
                "gpu-memory.limit='8192': must be a Kubernetes quantity with a byte suffix (e.g. 8Gi or "
                "8192Mi); KAI refuses a bare number here"
            ],
            id="memory-limit-without-unit",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", FRACTION_LIMIT: "1.5"},
            [f"gpu-fraction.limit='1.5': {SHARE_RULE}"],
            id="fraction-limit-above-one",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", FRACTION_LIMIT: "0.123456"},
            [f"gpu-fraction.limit='0.123456': {SHARE_RULE}"],
            id="fraction-limit-six-decimals",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", FRACTION_LIMIT: ""},
            [f"gpu-fraction.limit='': {SHARE_RULE}"],
            id="fraction-limit-empty",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", FRACTION_LIMIT: "nan"},
            [f"gpu-fraction.limit='nan': {SHARE_RULE}"],
            id="fraction-limit-nan",
        ),
        pytest.param(
            {names.GPU_MEMORY: "4Gi", FRACTION_LIMIT: "0.75"},
            [
                "gpu-fraction.limit='0.75': limits the share of GPU memory a gpu-fraction pod may use, and "
                "the pod sets no gpu-fraction: add gpu-fraction, or for a gpu-memory pod write "
                "gpu-memory.limit"
            ],
            id="fraction-limit-on-a-memory-pod",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", MEMORY_LIMIT: "8Gi"},
            [
                "gpu-memory.limit='8Gi': limits the memory of a gpu-memory pod, and the pod sets no "
                "gpu-memory: add gpu-memory, or for a gpu-fraction pod write gpu-fraction.limit"
            ],
            id="memory-limit-on-a-fraction-pod",
        ),
        pytest.param(
            {names.GPU_MEMORY: "4Gi", MEMORY_LIMIT: "8Gi", names.GPU_MEMORY_LIMIT: "8Gi"},
            [
                "gpu-memory.limit='8Gi': must not be set together with gpupack.io/gpu-memory-limit: both "
                "set the limit; use one"
            ],
            id="beside-gpupacks-own-limit",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", PORTION_SIDE: "0.75"},
            [
                f"{PORTION_SIDE}='0.75': names container 'side', but the GPU share goes to 'main' "
                "(gpu-fraction-container-name, else the first container)"
            ],
            id="portion-limit-on-another-container",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", FRACTION_LIMIT: "0.8", PORTION_MAIN: "0.9"},
            [
                f"{PORTION_MAIN}='0.9': disagrees with gpu-fraction.limit='0.8' (KAI's two spellings of it): "
                "set one"
            ],
            id="two-spellings-disagree",
        ),
        pytest.param(
            {names.GPU_FRACTION: "0.5", FRACTION_LIMIT: "0.8", names.ISOLATION: "mig"},
            [
                "gpupack.io/isolation='mig': needs gpu-memory or gpupack.io/mig-profile, not gpu-fraction: "
                "a MIG device is taken whole, never shared"
            ],
            id="mig",
        ),
    ],
)
def test_kai_limit_rules(annotations: dict[str, str], expected: list[str]) -> None:
    assert errors(annotations) == expected


def test_a_kai_limit_alone_asks_for_a_share_so_its_missing_request_is_refused() -> None:
    for key in (FRACTION_LIMIT, MEMORY_LIMIT, PORTION_MAIN):
        assert ask_of({key: "0.5"}).wanted
    assert "gpu-fraction='': one of gpu-fraction or gpu-memory is required" in errors({FRACTION_LIMIT: "0.5"})


def test_every_refusal_names_the_key_the_value_and_the_rule() -> None:
    result = parse({names.GPU_MEMORY: "8Gi", MEMORY_LIMIT: "4Gi"})
    assert isinstance(result, tuple)
    assert result == (
        RequestError(
            MEMORY_LIMIT,
            "4Gi",
            "is 4096 MiB, less than gpu-memory (8192 MiB): the limit must be at least the request",
        ),
    )


def _node(*memories: int) -> Node:
    gpus = tuple(Gpu(index=i, model="X", memory_mib=m, uuid=f"GPU-{i}") for i, m in enumerate(memories))
    return Node(name="n", gpus=gpus)


def test_a_share_limit_caps_each_gpu_at_its_share_of_that_gpus_memory() -> None:
    demand = parsed({names.GPU_FRACTION: "0.5", FRACTION_LIMIT: "0.75"}).demand()
    # 0.75 of a 40960 MiB GPU; the request (0.5) is 20480 MiB there.
    assert to_allocation(_node(40960), demand, (0,)).hard_limit_mib == 30720
    # On two GPUs of different sizes the cap is the least of them: 0.75 x 16160 floored.
    two = parsed({names.GPU_FRACTION: "0.5", FRACTION_LIMIT: "0.75", names.GPU_FRACTION_NUM_DEVICES: "2"})
    assert to_allocation(_node(40960, 16160), two.demand(), (0, 1)).hard_limit_mib == 12120
    # Not burstable: no cap recorded.
    assert (
        to_allocation(_node(40960), parsed({names.GPU_FRACTION: "0.5"}).demand(), (0,)).hard_limit_mib is None
    )
