"""MPS shares and Pod Security admission (pure): which namespaces' levels refuse an MPS pod, and our message.

With gpupack's RuntimeClass (chart `nodeSide.enabled`, webhook --runtime-class) an MPS pod carries no
hostPath: the node adds the pod's own MPS directory when the container is created (docs/node-side.md),
so the share runs in `baseline` and `restricted` namespaces like any pod (the rest of it complying).
An MPS pod still reaches the pipe directory through a hostPath volume where the webhook runs without
the RuntimeClass (legacy), or where the pod mounts the host's pipe directory itself (a KAI-style pod,
webhook.pipe); Pod Security levels `baseline` and `restricted` forbid every hostPath volume.

The webhook configuration sends pods of namespaces that enforce `baseline` / `restricted` to
/mutate/pod-security/<level> (a namespaceSelector on pod-security.kubernetes.io/enforce), so the webhook
refuses such a pod there with this message, which says what to change, instead of Pod Security refusing
the mutated pod with its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.core import names
from app.core.errors import RequestError
from app.core.request import GpuRequest, Isolation
from webhook.pipe import Writes

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
LEVELS_WITHOUT_HOSTPATH = ("baseline", "restricted")


def refusal(
    req: GpuRequest,
    annotations: Mapping[str, str],
    level: str,
    namespace: str,
    wrote: Writes | RequestError | None,
) -> RequestError | None:
    """The error for an MPS share whose pod would hold a hostPath in a namespace enforcing `level`, or None
    when the share may run there. `wrote`: what the patch writes for the pipe dir (mutate.pipe_writes)."""
    if req.isolation is not Isolation.MPS or level not in LEVELS_WITHOUT_HOSTPATH:
        return None
    if not isinstance(wrote, Writes) or not wrote.host_path:
        return None  # the RuntimeClass path (no hostPath), or a clash reported on its own
    forbidden = f"which Pod Security level {level!r} enforced in namespace {namespace!r} refuses"
    if wrote.mount is None:
        return RequestError(
            names.ISOLATION,
            annotations.get(names.ISOLATION, ""),
            f"the pod mounts the node's MPS pipe directory itself (a hostPath volume, at {wrote.pipe_dir}), "
            f"{forbidden}; remove that volume and its mount: gpupack's RuntimeClass gives the GPU container "
            "its pod's own MPS directory at the node",
        )
    return RequestError(
        names.ISOLATION,
        annotations.get(names.ISOLATION, ""),
        f"an MPS share (the default unless isolation is 'none') mounts the node's MPS pipe directory as a "
        f"hostPath volume where gpupack runs without its RuntimeClass, {forbidden}; install the node side "
        f"(chart nodeSide.enabled, docs/node-side.md), annotate {names.ISOLATION}: 'none' for a share "
        "without MPS, or run MPS pods in a namespace at level 'privileged'",
    )
