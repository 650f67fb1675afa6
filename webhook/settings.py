"""What the webhook's mutation depends on, set once at start-up from the command line or the chart."""

from __future__ import annotations

from dataclasses import dataclass

from app import names


@dataclass(frozen=True, slots=True)
class Settings:
    scheduler_name: str | None = None  # set spec.schedulerName on GPU pods only when configured
    mps_pipe_host_dir: str = names.MPS_PIPE_DIRECTORY  # host dir of the node's MPS control daemon
    # Rewrite pods asking for HAMi's nvidia.com/gpumem, gpumem-percentage or gpucores into a gpupack share
    # (webhook.hami); off by default: such pods are then left alone, for HAMi or the device plugin.
    hami_takeover: bool = False
