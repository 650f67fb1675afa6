#!/usr/bin/env bash
# Build gpupack-runc (the RuntimeClass handler: a static Go binary, standard library only) into a
# per-version cache dir; skips the build when the cached binary reports the same version and source hash.
# Prints the binary's path as the last line of stdout; progress on stderr.
#   handler/build.sh [OUT_DIR]   also copies the binary into OUT_DIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(tr -d '[:space:]' < "$here/VERSION")
src=$(cd "$here" && cat go.mod ./*.go | sha256sum | cut -c1-12)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/gpupack/handler/$version-$src
bin=$cache/gpupack-runc
if [ -x "$bin" ] && [ "$("$bin" --gpupack-version 2>/dev/null)" = "gpupack-runc $version-$src" ]; then
  echo "[handler] gpupack-runc $version-$src: cached" >&2
else
  echo "[handler] gpupack-runc $version-$src: go build" >&2
  mkdir -p "$cache"
  ( cd "$here" && CGO_ENABLED=0 GOFLAGS=-trimpath GOTOOLCHAIN=${GOTOOLCHAIN:-local} \
      go build -ldflags "-s -w -X main.Version=$version-$src" -o "$bin.tmp" . ) >&2
  mv "$bin.tmp" "$bin"
fi
if [ $# -gt 0 ]; then
  mkdir -p "$1" && cp "$bin" "$1/gpupack-runc"
fi
echo "$bin"
