"""The control-plane components as data: argv and health check for etcd, apiserver, controller-manager,
scheduler and kwok."""

from __future__ import annotations

from pathlib import Path

from . import realnode
from .layout import Layout, Ports
from .processes import ComponentSpec, HealthCheck

SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.244.0.0/16"
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
KWOK_NODE_LEASE_S = 40  # the kubelet's default nodeLeaseDurationSeconds
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def etcd(bins: Path, layout: Layout, ports: Ports) -> ComponentSpec:
    client = f"http://127.0.0.1:{ports.etcd}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return ComponentSpec(
        name="etcd",
        argv=(
            str(bins / "etcd"),
            "--name=default",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            # A throw-away cluster: durability buys nothing and fsync dominates write latency.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ),
        health=HealthCheck(f"{client}/health", expect='"health":"true"'),
        ready_timeout_s=60,
    )


def apiserver(
    bins: Path, layout: Layout, ports: Ports, *, service_account_admission: bool = False
) -> ComponentSpec:
    """`service_account_admission`: pods get their ServiceAccount token mounted, as in any cluster; what
    pods that talk to the API need (the chart's, on a real node), off otherwise (see the comment below)."""
    pki = layout.pki
    disabled = (
        "TaintNodesByCondition" if service_account_admission else "ServiceAccount,TaintNodesByCondition"
    )
    return ComponentSpec(
        name="kube-apiserver",
        argv=(
            str(bins / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{ports.etcd}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            # Without it the apiserver derives an address from the default route and dies where none exists.
            "--advertise-address=127.0.0.1",
            # The `kubernetes` Service endpoint would be a loopback IP, which the endpoint reconciler rejects
            # every few seconds; nothing here uses that Service.
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki.apiserver.cert}",
            f"--tls-private-key-file={pki.apiserver.key}",
            f"--client-ca-file={pki.ca.cert}",
            f"--token-auth-file={layout.tokens_csv}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Off although kube-controller-manager runs: with the ServiceAccount plugin a pod created right
            # after its namespace fails until the serviceaccount controller has made `default` there, and
            # TaintNodesByCondition keeps every new Node unschedulable until the node lifecycle controller
            # has seen kwok mark it Ready. Tests create namespaces and nodes and use them at once.
            f"--disable-admission-plugins={disabled}",
            # Webhooks behind a Service are dialled at a ready endpoint's IP: there is no kube-proxy.
            "--enable-aggregator-routing=true",
            "--allow-privileged=true",
            # For a real kubelet node (kubeletnode.py): its client certificate, and its InternalIP to dial.
            *realnode.apiserver_flags(pki.kubelet_client.cert, pki.kubelet_client.key),
            f"--cert-dir={layout.apiserver_cert_dir}",
            "--profiling=false",
            "--v=1",
        ),
        # /readyz is readable anonymously (system:public-info-viewer), so no token lands in state.json.
        health=HealthCheck(f"https://127.0.0.1:{ports.apiserver}/readyz", ca_file=str(pki.ca.cert)),
        ready_timeout_s=180,  # first start on 2 busy cores: bootstrap RBAC + CRD/aggregator post-start hooks
    )


def controller_manager(
    bins: Path, layout: Layout, ports: Ports, *, node_lease_s: int = KWOK_NODE_LEASE_S
) -> ComponentSpec:
    """The controllers a cluster enables by default (`*`), each as its own kube-system ServiceAccount.

    `node_lease_s`: the fake nodes' lease (see `kwok`); a node is unreachable after it plus 10 s unrenewed.
    """
    pki = layout.pki
    return ComponentSpec(
        name="kube-controller-manager",
        argv=(
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={layout.kubeconfig_for('controller-manager')}",
            "--controllers=*",
            # As kubeadm runs it: each controller gets its own ServiceAccount token (TokenRequest), so the
            # bootstrap RBAC roles (system:controller:*) decide what each may do.
            "--use-service-account-credentials=true",
            # The token controller signs legacy ServiceAccount token Secrets with the key the apiserver
            # verifies (--service-account-key-file), and publishes the CA in kube-root-ca.crt ConfigMaps.
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca.cert}",
            # The CSR signer (kubelet client/serving certificates) signs with the cluster CA.
            f"--cluster-signing-cert-file={pki.ca.cert}",
            f"--cluster-signing-key-file={pki.ca.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--cluster-cidr={POD_CIDR}",
            # One instance per cluster: leader election would only delay a restart by a lease period.
            "--leader-elect=false",
            # The default 50 s suits the kubelet's 40 s lease; a longer lease needs a longer grace.
            f"--node-monitor-grace-period={node_lease_s + 10}s",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.controller_manager}",
            f"--tls-cert-file={pki.controller_manager.cert}",
            f"--tls-private-key-file={pki.controller_manager.key}",
            "--v=1",
        ),
        health=HealthCheck(f"https://127.0.0.1:{ports.controller_manager}/healthz", ca_file=str(pki.ca.cert)),
        ready_timeout_s=90,
    )


def scheduler(bins: Path, layout: Layout, ports: Ports) -> ComponentSpec:
    return ComponentSpec(
        name="kube-scheduler",
        argv=(
            str(bins / "kube-scheduler"),
            f"--config={layout.scheduler_config}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.scheduler}",
            # A cert from our CA instead of a self-signed one, so the health check verifies TLS too.
            f"--tls-cert-file={layout.pki.scheduler.cert}",
            f"--tls-private-key-file={layout.pki.scheduler.key}",
            # No --authentication/authorization-kubeconfig: delegated authn would need a front-proxy CA
            # in the apiserver (else it logs errors forever), and /healthz, /readyz are always allowed.
            "--v=2",
        ),
        health=HealthCheck(f"https://127.0.0.1:{ports.scheduler}/readyz", ca_file=str(layout.pki.ca.cert)),
        ready_timeout_s=90,
    )


def kwok(bins: Path, layout: Layout, ports: Ports, *, node_lease_s: int = KWOK_NODE_LEASE_S) -> ComponentSpec:
    """`node_lease_s`: each fake node's lease, renewed every quarter of it. The kubelet's 40 s means one
    write every 10 s per node: 500 a second at 5 000 nodes, more than 2 cores serve beside a benchmark."""
    key, value = KWOK_NODE_ANNOTATION
    return ComponentSpec(
        name="kwok",
        argv=(
            str(bins / "kwok"),
            f"--kubeconfig={layout.kubeconfig_for('kwok')}",
            # An explicit (empty) config, so a user's ~/.kwok/kwok.yaml cannot change how fake nodes behave.
            f"--config={layout.kwok_config}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            # Renew a Lease per fake node, as a kubelet does: kube-controller-manager's node lifecycle
            # controller otherwise sees no heartbeat after the first status and taints every kwok node
            # unreachable (NoSchedule, then NoExecute) about 50 s after it was created.
            f"--node-lease-duration-seconds={node_lease_s}",
            f"--cidr={POD_CIDR}",
            "--node-ip=10.244.0.1",
            f"--server-address=127.0.0.1:{ports.kwok}",
        ),
        health=HealthCheck(f"http://127.0.0.1:{ports.kwok}/healthz"),
        ready_timeout_s=60,
    )


def control_plane(
    bins: Path,
    layout: Layout,
    ports: Ports,
    *,
    service_account_admission: bool = False,
    node_lease_s: int = KWOK_NODE_LEASE_S,
) -> list[ComponentSpec]:
    """In start order. The scheduler before kwok: kwok only acts on pods the scheduler already bound."""
    return [
        etcd(bins, layout, ports),
        apiserver(bins, layout, ports, service_account_admission=service_account_admission),
        controller_manager(bins, layout, ports, node_lease_s=node_lease_s),
        scheduler(bins, layout, ports),
        kwok(bins, layout, ports, node_lease_s=node_lease_s),
    ]


KWOK_CONFIG = """\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options: {}
"""
