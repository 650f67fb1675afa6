#!/usr/bin/env bash
# Run the GPU suite on a bare GPU machine without network, from a copied tree; see tests/gpu/README.md.
#
#   tests/gpu/run.sh [extra pytest args]
#
# Installs the wheels from .whl/ whose distribution the interpreter lacks or has at another version (into
# /tmp/gpupack-site, which then shadows the installed copy: we test the versions gpupack pins),
# runs tests/gpu with the repo on PYTHONPATH (no editable install needed), and writes:
#   $GPUPACK_GPU_REPORT (default $OUT/gpu-report.json, else ./gpu-report.json)  facts, measurements, outcomes
#   gpu-pytest.log, gpu-junit.xml, nvidia-smi.txt                                beside the report
# Exit status: pytest's (2 when the suite could not start at all; the report then says why).
set -uo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
PY="${PYTHON:-python3}"
export GPUPACK_GPU_REPORT="${GPUPACK_GPU_REPORT:-${OUT:-$repo}/gpu-report.json}"
outdir="$(dirname "$GPUPACK_GPU_REPORT")"
mkdir -p "$outdir"
site="${GPUPACK_GPU_SITE:-/tmp/gpupack-site}"
rm -rf "$site"  # ours alone; a copy left by another interpreter would shadow this one's packages

fail_report() { # why: the suite never ran; leave a report that says so
  "$PY" - "$GPUPACK_GPU_REPORT" "$1" <<'EOF'
import json, platform, sys
json.dump({"summary": {"not_run": 1}, "error": sys.argv[2], "environment": {"python": platform.python_version()}},
          open(sys.argv[1], "w"), indent=2)
EOF
  echo "gpu suite not run: $1" >&2
  exit 2
}

# 1. Wheels: install the ones whose distribution is missing here or installed at another version.
missing=()
if compgen -G ".whl/*.whl" >/dev/null; then
  for whl in .whl/*.whl; do
    dist="$(basename "$whl" | cut -d- -f1)"
    ver="$(basename "$whl" | cut -d- -f2)"
    if ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version(sys.argv[1]) != sys.argv[2])" \
      "$dist" "$ver" 2>/dev/null; then
      missing+=("$whl")
    fi
  done
fi
if ((${#missing[@]})); then
  echo "[gpu] installing ${#missing[@]} wheel(s) missing or at another version into $site: ${missing[*]##*/}"
  mkdir -p "$site"
  if ! "$PY" -m pip install --quiet --no-index --no-deps --target "$site" "${missing[@]}" 2>"$outdir/pip.log"; then
    # No pip: a wheel is a zip laid out for site-packages, so unpacking it is an install.
    "$PY" - "$site" "${missing[@]}" <<'EOF' || fail_report "could not unpack wheels (see pip.log)"
import sys, zipfile
for w in sys.argv[2:]:
    zipfile.ZipFile(w).extractall(sys.argv[1])
EOF
  fi
fi
export PYTHONPATH="$repo:$site${PYTHONPATH:+:$PYTHONPATH}"

# 2. Preflight: what the suite imports outside the standard library.
"$PY" -c "import pytest, yaml, pynvml, pydantic" 2>"$outdir/preflight.log" \
  || fail_report "pytest, pyyaml, nvidia-ml-py or pydantic missing and not in .whl/: $(tail -1 "$outdir/preflight.log")"
{ nvidia-smi && nvidia-smi -q; } >"$outdir/nvidia-smi.txt" 2>&1 || true

# 3. The suite. Everything in tests/gpu runs: the CI-level harness checks first, then the GPU ones.
echo "[gpu] python $("$PY" -c 'import platform; print(platform.python_version())'), report -> $GPUPACK_GPU_REPORT"
# GPUPACK_GPU_TESTS: which tests (files in the order given). Plugins: only pytest-timeout, so a GPU image's
# own pytest plugins (cov, xdist, hypothesis, ...) built for another pytest cannot break the run.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
# shellcheck disable=SC2086
"$PY" -m pytest ${GPUPACK_GPU_TESTS:-tests/gpu} -v -p pytest_timeout -p no:cacheprovider --junitxml="$outdir/gpu-junit.xml" "$@" 2>&1 \
  | tee -i "$outdir/gpu-pytest.log"  # -i: a SIGINT at the budget stops pytest, which then still reports
rc=${PIPESTATUS[0]}
echo "[gpu] pytest exit $rc; report: $GPUPACK_GPU_REPORT"
exit "$rc"
