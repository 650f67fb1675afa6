"""A real local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok) for tests
and `python -m tests.devcluster`, with the fault proxy and the real kubelet node of the test tiers.

The development harness: it runs from a source checkout and ships in neither the wheel nor the image;
an import contract keeps app, webhook, extender and agent from importing it.
"""

from .binaries import BinariesError, ensure_binaries
from .cluster import Cluster, ComponentStatus, default_dir
from .identities import GPUPACK_NAMESPACE, IDENTITY_KEYS
from .nodes import create_gpu_nodes, node_body
from .poll import WaitTimeoutError, wait_for
from .processes import ComponentError, ComponentSpec, HealthCheck, ManagedProcess

__all__ = [
    "GPUPACK_NAMESPACE",
    "IDENTITY_KEYS",
    "BinariesError",
    "Cluster",
    "ComponentError",
    "ComponentSpec",
    "ComponentStatus",
    "HealthCheck",
    "ManagedProcess",
    "WaitTimeoutError",
    "create_gpu_nodes",
    "default_dir",
    "ensure_binaries",
    "node_body",
    "wait_for",
]
