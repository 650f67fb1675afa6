"""The container image's Dockerfile against what the chart, the package and the build context expect.

No image is built here (no registry, no build tool in this tier); these are the contracts that break
silently: the uid the chart runs as, the entrypoint the chart's args assume, every package copied in.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
MANIFEST = REPO / "deploy/manifests/gpupack.yaml"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (a stage starts at FROM); global ARGs before the first dropped."""
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(text):
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def global_args(text: str) -> dict[str, str]:
    args: dict[str, str] = {}
    for word, rest in instructions(text):
        if word == "FROM":
            break
        if word == "ARG":
            key, _, value = rest.partition("=")
            args[key] = value
    return args


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_runtime_user_is_the_charts_non_root_uid() -> None:
    final = stages(DOCKERFILE.read_text())[-1]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "the runtime stage sets no USER: the image would run as root"
    uid, _, gid = users[-1].partition(":")
    values = yaml.safe_load((REPO / "deploy/helm/gpupack/values.yaml").read_text())
    ctx = values["podSecurityContext"]
    assert ctx["runAsNonRoot"] is True
    # runAsNonRoot only admits a numeric non-zero USER; the chart's uid/gid must be the image's.
    assert (int(uid), int(gid)) == (ctx["runAsUser"], ctx["runAsGroup"])
    assert int(uid) != 0


def test_entrypoint_is_the_console_script_the_chart_passes_args_to() -> None:
    final = stages(DOCKERFILE.read_text())[-1]
    entry = [json.loads(rest) for word, rest in final if word == "ENTRYPOINT"]
    assert entry == [["gpupack"]]
    assert "gpupack" in pyproject()["project"]["scripts"]
    # Every gpupack container in the rendered chart gives args (a subcommand), never its own command.
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    gpupack_containers = [
        c
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
        if "/gpupack:" in c["image"]
    ]
    assert gpupack_containers
    for c in gpupack_containers:
        if c["name"] == "mps-control":  # NVIDIA's MPS binary (mounted by the NVIDIA runtime), not gpupack
            assert c["command"][0] == "nvidia-cuda-mps-control", c["command"]
            continue
        assert "command" not in c, f"{c['name']} overrides the entrypoint"
        assert c["args"][0] in ("webhook", "extender", "agent"), c["args"]


def test_every_package_is_copied_and_not_excluded_by_dockerignore() -> None:
    text = DOCKERFILE.read_text()
    copied = {rest.split()[0] for stage in stages(text)[:-1] for word, rest in stage if word == "COPY"}
    packages = {p.rstrip("*") for p in pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]}
    readme = pyproject()["project"]["readme"]
    license_files = set(pyproject()["project"]["license-files"])  # the build fails without them
    assert packages | {"pyproject.toml", readme, "handler"} | license_files <= copied
    # .dockerignore: last matching pattern wins; a path must end up included.
    patterns = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and line[0] != "#"
    ]

    def included(path: str) -> bool:
        keep = True
        for pat in patterns:
            negate = pat.startswith("!")
            if fnmatch.fnmatch(path, pat.lstrip("!")):
                keep = negate
        return keep

    for path in sorted(copied):
        assert included(path), f"{path} is COPYed but .dockerignore leaves it out of the build context"
    assert not included(".venv") and not included("tests")


def test_default_base_is_the_official_python_slim_image_pinned_to_a_patch_release() -> None:
    text = DOCKERFILE.read_text()
    base = global_args(text)["BASE_IMAGE"]
    m = re.fullmatch(r"docker\.io/library/python:(\d+)\.(\d+)\.(\d+)-slim-[a-z]+", base)
    assert m, f"BASE_IMAGE={base!r}: expected python:X.Y.Z-slim-<debian release>"
    needed = pyproject()["project"]["requires-python"]
    assert needed == f">={m[1]}.{m[2]}"
    froms = [rest for w, rest in instructions(text) if w == "FROM"]
    # Every stage on the base, but the handler's: gpupack-runc is built with the official Go image.
    assert [f for f in froms if f != "${BASE_IMAGE}" and not f.startswith("${BASE_IMAGE} ")] == [
        "${GO_IMAGE} AS handler"
    ]
    assert re.fullmatch(r"docker\.io/library/golang:\d+\.\d+-[a-z]+", global_args(text)["GO_IMAGE"])


def test_runtime_stage_carries_oci_labels() -> None:
    final = stages(DOCKERFILE.read_text())[-1]
    labels = " ".join(rest for word, rest in final if word == "LABEL")
    for key in ("title", "description", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert pyproject()["project"]["license"] in labels  # an SPDX expression (PEP 639)
    args = [rest for word, rest in final if word == "ARG"]
    versions = [a.partition("=")[2] for a in args if a.startswith("VERSION=")]
    assert versions == [pyproject()["project"]["version"]]
    chart = yaml.safe_load((REPO / "deploy/helm/gpupack/Chart.yaml").read_text())
    assert versions == [chart["appVersion"]]  # the chart's image tag defaults to its appVersion


def test_neither_the_image_nor_the_wheel_carries_the_development_harness() -> None:
    # tests/devcluster (local control plane, fault proxy, kubelet node) runs `make dev` and the test
    # tiers from a checkout; the product must not ship it (an import contract keeps the product off it).
    from setuptools import find_packages

    build = stages(DOCKERFILE.read_text())[0]
    copied = {rest.split()[0] for word, rest in build if word == "COPY"}
    assert not any(src == "tests" or src.startswith(("tests/", "./tests")) for src in copied), copied
    find = pyproject()["tool"]["setuptools"]["packages"]["find"]
    shipped = find_packages(where=str(REPO), include=find["include"])
    assert "app" in shipped and "agent.nvml" in shipped  # the find rule does see the product
    assert not [p for p in shipped if p == "tests" or p.startswith("tests.")]
    # Nor does the wheel declare a command from it.
    commands = pyproject()["project"]["entry-points"]["gpupack.commands"]
    assert not [value for value in commands.values() if value.startswith("tests.")], commands
