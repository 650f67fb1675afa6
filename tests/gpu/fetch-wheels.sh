#!/usr/bin/env bash
# Download the wheels tests/gpu/run.sh may need into .whl/ (repo root), for a CPython 3.12 x86_64 GPU machine
# without network. Run from the repo root on a machine with network; pass another dir as $1 if wanted.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest="${1:-.whl}"
py="${PYTHON:-python3}"
grep -v '^\s*#' tests/gpu/wheels.txt | grep -v '^\s*$' | while read -r req; do
  "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d "$dest" "$req"
done
ls "$dest"
