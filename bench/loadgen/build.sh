#!/usr/bin/env bash
# Build bench/loadgen (Go standard library only) into a cache dir keyed by its source and the Go version.
# Progress goes to stderr; the last line of stdout is the binary's path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
key=$( (cat "$here/go.mod" "$here/main.go"; go version) | sha256sum | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/gpupack/loadgen/$key
bin=$cache/loadgen
if [ -x "$bin" ]; then
  echo "[loadgen] cached at $bin" >&2
else
  echo "[loadgen] building $bin" >&2
  mkdir -p "$cache"
  export CGO_ENABLED=0 GOFLAGS=-trimpath GOTOOLCHAIN=${GOTOOLCHAIN:-local}
  ( cd "$here" && go build -ldflags "-s -w" -o "$bin.tmp" . ) >&2
  mv "$bin.tmp" "$bin"
fi
echo "$bin"
