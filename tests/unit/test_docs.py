"""The docs point at things that exist: links and their anchors, repository paths, metric series, alerts,
and every module and import-contract layer of the code on the layout pages.

A link to one of the pages in AWAITED is let through while that page is missing (it is being written
elsewhere); once the page exists its links and anchors are checked like any other.
"""

from __future__ import annotations

import glob
import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", REPO / "deploy/helm/gpupack/README.md", *(REPO / "docs").rglob("*.md")])
AWAITED = {
    "docs/mixed-fleets-and-quota.md",
    "docs/developer/pod-view.md",
    "docs/upgrades.md",
    "docs/node-side.md",
}
LAYOUT = REPO / "docs/developer/layout.md"
GUIDE = REPO / "docs/developer-guide.md"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# A `code` span that names a file or folder of this repository.
REPO_PATH = re.compile(r"^(?:app|agent|extender|webhook|deploy|tests|bench|docs|\.ci)/[\w./*{},-]*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
SERIES = re.compile(r"gpupack_(?:webhook|extender|agent)_[a-z_]+")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def prose(path: Path) -> str:
    """The page without its fenced code blocks (their brackets and paths are examples, not references)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to '-', repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose(path), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> Iterator[str]:
    yield from LINK.findall(prose(path))


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue  # a web address: not checked without a network
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            if rel(dest) not in AWAITED:
                broken.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: {rel(dest)} has no heading with anchor #{anchor}")
    assert not broken, f"{rel(page)}:\n" + "\n".join(broken)


def expand(pattern: str) -> list[str]:
    """`a/{b,c}.json` → `a/b.json`, `a/c.json` (one level of braces is all the docs use)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [pattern[: m.start()] + part + pattern[m.end() :] for part in m[1].split(",")]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_repository_path_named_exists(page: Path) -> None:
    missing = []
    for span in re.findall(r"`([^`\s]+)`", page.read_text()):
        if not REPO_PATH.match(span):
            continue
        for path in expand(span):
            if not glob.glob(str(REPO / path.rstrip("/"))):
                missing.append(path)
    assert not missing, f"{rel(page)} names paths that do not exist: {sorted(set(missing))}"


def defined_series() -> tuple[set[str], set[str]]:
    """Series names written in the code, and the prefixes of those built with an f-string (`..._{k}`)."""
    names: set[str] = set()
    prefixes: set[str] = set()
    for package in PYPROJECT["tool"]["importlinter"]["root_packages"]:
        for source in (REPO / package).rglob("*.py"):
            text = source.read_text()
            names.update(re.findall(r"[\"'](gpupack_[a-z_]+)[\"']", text))
            prefixes.update(re.findall(r"f[\"'](gpupack_[a-z_]+)\{", text))
    return names, prefixes


def test_every_metric_series_named_exists() -> None:
    names, prefixes = defined_series()
    unknown = set()
    for page in PAGES:
        for series in SERIES.findall(page.read_text()):
            base = re.sub(r"_(bucket|sum|count)$", "", series)
            if base not in names and not any(base.startswith(p) for p in prefixes):
                unknown.add(f"{rel(page)}: {series}")
    assert not unknown, "series no component defines:\n" + "\n".join(sorted(unknown))


def test_alerts_table_is_the_rules_file() -> None:
    rules = yaml.safe_load((REPO / "deploy/prometheus/gpupack-rules.yaml").read_text())
    defined = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    text = (REPO / "docs/operator/metrics.md").read_text()
    documented = set(re.findall(r"^\| `(Gpupack\w+)` \|", text, flags=re.M))
    assert documented == defined, (
        f"only in the docs: {documented - defined}; only in the rules: {defined - documented}"
    )


def product_files() -> list[str]:
    """Every source and data file of the packages the import contracts cover (no caches, no __init__)."""
    out = []
    for package in PYPROJECT["tool"]["importlinter"]["root_packages"]:
        for path in sorted((REPO / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.name != "__init__.py":
                out.append(rel(path))
    return out


def test_layout_page_names_every_module() -> None:
    text = LAYOUT.read_text()
    missing = [f for f in product_files() if f"`{f}`" not in text]
    assert not missing, f"{rel(LAYOUT)} does not list: {missing}"


def test_layout_picture_has_every_layer_of_the_contracts() -> None:
    section = GUIDE.read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\b(?:app|webhook|extender|agent)(?:\.\w+)*\b", section))
    layers = []
    for contract in PYPROJECT["tool"]["importlinter"]["contracts"]:
        if contract["type"] == "layers" and not contract.get("containers"):
            layers += [m.strip() for layer in contract["layers"] for m in re.split(r"[|:]", layer)]
    missing = [m for m in layers if m not in named]
    assert layers, "pyproject.toml has no layers contract"
    assert not missing, f"the layout picture in {rel(GUIDE)} misses layers of the import contracts: {missing}"


def test_ci_runs_the_documented_test_command() -> None:
    """README and the developer guide promise that CI runs exactly `make test`; `.ci/run` must do so."""
    commands = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()]
    assert commands[-1] == "make test", f".ci/run ends with {commands[-1]!r}, not `make test`"
    for page in (REPO / "README.md", GUIDE):
        assert "`.ci/run`" in page.read_text() and "`make test`" in page.read_text(), rel(page)


def test_packing_table_is_the_bench_result() -> None:
    """docs/performance.md's packing table shows bench/results/packing.json, rounded to 2 decimals."""
    result = json.loads((REPO / "bench/results/packing.json").read_text())
    text = (REPO / "docs/performance.md").read_text().split("## Packing quality", 1)[1].split("\n## ", 1)[0]
    header, rows = None, []
    for line in text.splitlines():
        if line.startswith("| trace |"):
            header = [c.strip() for c in line.strip("|").split("|")]
        elif header and re.match(r"^\| \w+ \|", line):
            rows.append([c.strip().strip("*") for c in line.strip("|").split("|")])
    # column → (the result's section, its name there)
    sources = {1: ("results", "fragaware"), 2: ("results", "fgd"), 3: ("published", "FGD")}
    sources |= {4: ("results", "binpack"), 5: ("published", "BestFit")}
    assert header and rows, "no packing table under ## Packing quality"
    wrong = []
    for row in rows:
        for col, (section, name) in sources.items():
            value = result[section].get(row[0], {}).get(name, {}).get("unallocated_pct_at_100")
            shown = row[col] if re.fullmatch(r"\d+\.\d\d", row[col]) else None
            if (value is None) != (shown is None) or (shown and f"{value:.2f}" != shown):
                wrong.append(f"{row[0]} {header[col]}: docs {row[col]!r}, packing.json {value}")
    assert not wrong, "\n".join(wrong)
