"""MPS shares and Pod Security admission (pure): which namespaces' levels refuse an MPS pod, and our message.

An MPS client pod gets the node's MPS pipe directory as a hostPath volume, mounted read-write (a client
opens the control daemon's pipe for writing). Pod Security levels `baseline` and `restricted` forbid every
hostPath volume, so an MPS pod can run only in a namespace at level `privileged` (or with no enforced
level). `gpupack.io/isolation: none` adds no volume and nothing else Pod Security checks: such a pod passes
`restricted` when the rest of it does.

The webhook configuration sends pods of namespaces that enforce `baseline` / `restricted` to
/mutate/pod-security/<level> (a namespaceSelector on pod-security.kubernetes.io/enforce), so the webhook
refuses an MPS share there with this message instead of the pod being mutated into one that Pod Security
then refuses with its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from app import names
from app.errors import RequestError
from app.request import GpuRequest, Isolation

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
LEVELS_WITHOUT_HOSTPATH = ("baseline", "restricted")


def refusal(
    req: GpuRequest, annotations: Mapping[str, str], level: str, namespace: str
) -> RequestError | None:
    """The error for an MPS share in a namespace enforcing `level`, or None when the share may run there."""
    if req.isolation is not Isolation.MPS or level not in LEVELS_WITHOUT_HOSTPATH:
        return None
    return RequestError(
        names.ISOLATION,
        annotations.get(names.ISOLATION, ""),
        f"an MPS share (the default unless isolation is 'none') mounts the node's MPS pipe directory as a "
        f"hostPath volume, which Pod Security level {level!r} enforced in namespace {namespace!r} refuses; "
        f"annotate {names.ISOLATION}: 'none' for a share without MPS, or run MPS pods in a namespace at "
        f"level 'privileged'",
    )
