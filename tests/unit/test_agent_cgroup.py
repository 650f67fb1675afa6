"""pid → pod from /proc/<pid>/cgroup: cgroup v1/v2 with the systemd and cgroupfs drivers."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.enforce import cgroup
from agent.enforce.cgroup import PodRef, ProcResolver

UID = "0f1c2b3a-4d5e-6f70-8192-a3b4c5d6e7f8"
SUID = UID.replace("-", "_")  # the systemd driver spells the UID with underscores
CID = "3f2a9c1b7d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8"


@pytest.mark.parametrize(
    ("line", "want"),
    [
        # cgroup v2, systemd driver (containerd, CRI-O, docker scopes)
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SUID}.slice/"
            f"cri-containerd-{CID}.scope",
            PodRef(UID, CID),
        ),
        (
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice/"
            f"crio-{CID}.scope",
            PodRef(UID, CID),
        ),
        (
            f"0::/kubepods.slice/kubepods-pod{SUID}.slice/docker-{CID}.scope",
            PodRef(UID, CID),
        ),
        # cgroup v2, cgroupfs driver (guaranteed pods have no QoS level)
        (f"0::/kubepods/burstable/pod{UID}/{CID}", PodRef(UID, CID)),
        (f"0::/kubepods/pod{UID}/{CID}", PodRef(UID, CID)),
        # cgroup v1 hierarchies
        (f"12:memory:/kubepods/besteffort/pod{UID}/{CID}", PodRef(UID, CID)),
        (
            f"4:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SUID}.slice/"
            f"cri-containerd-{CID}.scope",
            PodRef(UID, CID),
        ),
        (f"11:cpu,cpuacct:/kubepods/burstable/pod{UID}", PodRef(UID, "")),
        # kind / nested container runtimes put the kubepods tree below another prefix
        (f"0::/system.slice/docker-abc.scope/kubepods/burstable/pod{UID}/{CID}", PodRef(UID, CID)),
        # not in a pod
        ("0::/system.slice/containerd.service", None),
        ("0::/user.slice/user-1000.slice/session-3.scope", None),
        ("1:name=systemd:/init.scope", None),
        ("", None),
    ],
)
def test_parse_line(line: str, want: PodRef | None) -> None:
    assert cgroup.parse_line(line) == want


def test_uppercase_uid_is_normalised() -> None:
    ref = cgroup.parse_line(f"0::/kubepods/pod{UID.upper()}/{CID}")
    assert ref == PodRef(UID, CID)


def test_v1_file_prefers_a_line_with_the_container() -> None:
    text = "\n".join(
        [
            "13:rdma:/",
            f"12:pids:/kubepods/burstable/pod{UID}",
            f"11:memory:/kubepods/burstable/pod{UID}/{CID}",
            "0::/",
        ]
    )
    assert cgroup.parse(text) == PodRef(UID, CID)


def test_host_process_file_has_no_pod() -> None:
    assert cgroup.parse("12:memory:/\n0::/init.scope\n") is None


def test_resolver_reads_a_fake_proc_root(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{UID}/{CID}\n")
    resolver = ProcResolver(tmp_path)
    assert resolver.pod_of(4242) == PodRef(UID, CID)
    assert resolver.pod_of(999) is None  # exited process
