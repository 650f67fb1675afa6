"""KAI-Scheduler's NvFractions names read as gpupack's request: KAI's documented examples, each rule."""

from __future__ import annotations

import pytest

from app.core import names, request
from app.core.model import Gpu, Node
from app.core.placement import registry
from app.core.podview import ContainerView, Kind, PodView, ask_of
from app.core.request import GpuRequest, Isolation

REQ = "nvidia.com/container.gpu-workload.gpu-memory.request"
LIM = "nvidia.com/container.gpu-workload.gpu-memory.limit"
MODE = "nvidia.com/container.gpu-workload.gpu-compute.mode"
POD_MODE = "kai.scheduler/gpu-compute-sharing-mode"
CONTAINERS = (
    ContainerView(Kind.REGULAR, 0, "sidecar"),
    ContainerView(Kind.REGULAR, 1, "gpu-workload"),
)


def parse(annotations: dict[str, str]) -> GpuRequest | list[str]:
    result = request.parse(PodView(annotations=annotations, containers=CONTAINERS))
    return result if isinstance(result, GpuRequest) else [str(e) for e in result]


def parsed(annotations: dict[str, str]) -> GpuRequest:
    result = parse(annotations)
    assert isinstance(result, GpuRequest), result
    return result


# --- KAI's documented examples (docs/gpu-sharing/README.md and the gpu-sharing operator's README) ---


def test_a_request_gives_that_container_its_memory_with_no_burst() -> None:
    req = parsed({REQ: "7680Mi"})
    assert (req.container, req.memory_mib, req.memory_limit_mib, req.milli) == (
        "gpu-workload",
        7680,
        None,
        None,
    )
    assert req.isolation is Isolation.MPS and not req.isolation_explicit  # time-slicing is KAI's default


def test_a_request_and_a_limit_are_gpupacks_request_and_limit() -> None:
    req = parsed({REQ: "4096Mi", LIM: "8192Mi", names.GPU_FRACTION_NUM_DEVICES: "2"})
    assert (req.memory_mib, req.memory_limit_mib, req.count) == (4096, 8192, 2)
    assert req.resource == (names.RESOURCE_GPU_MEMORY_MIB, 8192)  # placement and quota: the request


def test_a_limit_alone_is_also_the_request() -> None:
    req = parsed({LIM: "8Gi"})
    assert (req.memory_mib, req.memory_limit_mib) == (8192, None)


def test_a_bare_number_is_bytes_as_in_every_kubernetes_quantity() -> None:
    assert parsed({REQ: "8589934592"}).memory_mib == 8192
    assert parse({REQ: "4096"}) == [
        f"{REQ}='4096': is 4096 bytes, less than 1 MiB (a bare number is bytes): write e.g. 4096Mi"
    ]
    assert parse({REQ: "4 Gi"}) == [
        f"{REQ}='4 Gi': must be a Kubernetes quantity of bytes (e.g. 4Gi or 7680Mi)"
    ]
    req = parsed({REQ: "500M"})
    assert req.warnings == (f"{REQ}='500M' is 476.837158203125 MiB; rounded up to 477 MiB",)


# --- compute mode: both spellings ---


@pytest.mark.parametrize("key", [MODE, POD_MODE])
def test_sm_sharing_requires_mps_in_either_spelling(key: str) -> None:
    req = parsed({REQ: "4Gi", key: "sm-sharing"})
    assert req.isolation is Isolation.MPS and req.isolation_explicit
    assert req.demand().needs_mps


@pytest.mark.parametrize("key", [MODE, POD_MODE])
@pytest.mark.parametrize("name", registry.names())
def test_an_sm_sharing_pod_refused_for_want_of_mps_is_told_the_key_it_wrote(key: str, name: str) -> None:
    """Not "isolation=mps", which the user never wrote: KAI's own key and value, and that it means MPS."""
    demand = parsed({REQ: "4Gi", key: "sm-sharing"}).demand()
    no_mps = Node("a", (Gpu(0, "A100-40GB", 40960),), mps=False, mps_reason="MPS is disabled on this node")
    reason = registry.create(name).filter(no_mps, demand)
    assert reason is not None
    assert reason.rule == f"pod asks for {key}=sm-sharing (MPS), but MPS is disabled on this node"
    gpupack = parsed({REQ: "4Gi", names.ISOLATION: "mps"}).demand()
    refused = registry.create(name).filter(no_mps, gpupack)
    assert refused is not None
    assert refused.rule == "pod asks for gpupack.io/isolation=mps, but MPS is disabled on this node"


@pytest.mark.parametrize("key", [MODE, POD_MODE])
def test_time_slicing_asks_for_gpupacks_default(key: str) -> None:
    req = parsed({REQ: "4Gi", key: "time-slicing"})
    assert req.isolation is Isolation.MPS and not req.isolation_explicit
    assert not req.demand().needs_mps


def test_kais_gpu_fraction_example_with_the_pod_level_mode() -> None:
    req = parsed({names.GPU_FRACTION: "0.5", POD_MODE: "time-slicing"})
    assert (req.milli, req.container) == (500, "sidecar")  # legacy names: the first container
    # A per-container mode names the container that gets the share, like gpu-fraction-container-name.
    assert parsed({names.GPU_FRACTION: "0.5", MODE: "sm-sharing"}).container == "gpu-workload"


def test_a_mode_alone_asks_for_no_share() -> None:
    assert not ask_of({POD_MODE: "sm-sharing"}).wanted
    assert not ask_of({MODE: "sm-sharing"}).wanted
    assert ask_of({LIM: "1Gi"}).wanted
    assert not ask_of(
        {"nvidia.com/container.gpu-workload.gpus.devices": "0"}
    ).wanted  # KAI's binder writes it


# --- rules ---


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param(
            {REQ: "8Gi", LIM: "4Gi"},
            [f"{LIM}='4Gi': is 4096 MiB, less than {REQ} (8192 MiB): the limit must be at least the request"],
            id="limit-below-request",
        ),
        pytest.param(
            {REQ: "100Gi"},
            [f"{REQ}='100Gi': is 102400 MiB, more than any GPU gpupack knows (A100-80GB has 81920 MiB)"],
            id="request-above-any-gpu",
        ),
        pytest.param(
            {REQ: "4Gi", "nvidia.com/container.sidecar.gpu-memory.limit": "8Gi"},
            [
                "nvidia.com/container.sidecar.gpu-memory.limit='8Gi': names container 'sidecar', but "
                f"{REQ} names 'gpu-workload': only one container of a pod gets a GPU share"
            ],
            id="two-containers",
        ),
        pytest.param(
            {"nvidia.com/container.trainer.gpu-memory.request": "4Gi"},
            [
                "nvidia.com/container.trainer.gpu-memory.request='4Gi': names container 'trainer', which the "
                "pod does not have ('sidecar', 'gpu-workload')"
            ],
            id="no-such-container",
        ),
        pytest.param(
            {REQ: "4Gi", names.GPU_FRACTION_CONTAINER_NAME: "sidecar"},
            [
                f"gpu-fraction-container-name='sidecar': must name the container {REQ} names "
                "('gpu-workload'), or be left out"
            ],
            id="container-name-disagrees",
        ),
        pytest.param(
            {REQ: "4Gi", names.GPU_FRACTION_CONTAINER_NAME: "gpu-workload"},
            [],
            id="container-name-agrees",
        ),
        pytest.param(
            {REQ: "4Gi", names.GPU_MEMORY: "4096"},
            [
                f"{REQ}='4Gi': must not be set together with gpu-memory: both ask for the GPU share; use one "
                "of the two"
            ],
            id="beside-gpu-memory",
        ),
        pytest.param(
            {LIM: "8Gi", names.GPU_FRACTION: "0.5", names.GPU_MEMORY_LIMIT: "8Gi"},
            [
                f"{LIM}='8Gi': must not be set together with gpu-fraction: both ask for the GPU share; use "
                "one of the two",
                f"{LIM}='8Gi': must not be set together with gpupack.io/gpu-memory-limit: both ask for the "
                "GPU share; use one of the two",
            ],
            id="beside-gpu-fraction-and-gpupack-limit",
        ),
        pytest.param(
            {REQ: "4Gi", MODE: "sm-sharing", POD_MODE: "time-slicing"},
            [
                f"{MODE}='sm-sharing': disagrees with {POD_MODE}='time-slicing' (KAI's two spellings of the "
                "mode): set one"
            ],
            id="spellings-disagree",
        ),
        pytest.param({REQ: "4Gi", MODE: "sm-sharing", POD_MODE: "sm-sharing"}, [], id="spellings-agree"),
        pytest.param(
            {REQ: "4Gi", POD_MODE: "mps"},
            [f"{POD_MODE}='mps': must be 'time-slicing' or 'sm-sharing'"],
            id="unknown-mode",
        ),
        pytest.param(
            {REQ: "4Gi", POD_MODE: "sm-sharing", names.ISOLATION: "none"},
            [
                f"{POD_MODE}='sm-sharing': needs MPS (SMs shared at once by MPS clients), but "
                "gpupack.io/isolation is 'none'"
            ],
            id="sm-sharing-without-mps",
        ),
        pytest.param(
            {REQ: "4Gi", POD_MODE: "time-slicing", names.ISOLATION: "none"}, [], id="time-slicing-none"
        ),
    ],
)
def test_rules(annotations: dict[str, str], expected: list[str]) -> None:
    result = parse(annotations)
    assert (result if isinstance(result, list) else []) == expected
