#!/usr/bin/env bash
# Build Karpenter's kwok cloud provider (sigs.k8s.io/karpenter/kwok, the version pinned in go.mod) into a
# per-version cache dir, and copy next to it the CRDs that version ships (NodePool, NodeClaim, KWOKNodeClass, ...).
# Skips the build when the cached binary and its stamp match that version.
# GPUPACK_KARPENTER=/path/to/dir (holding `karpenter-kwok` and `crds/`) skips building altogether.
# Progress goes to stderr; the last line of stdout is the cache dir.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KV=$(awk '$1 == "require" && $2 == "sigs.k8s.io/karpenter" {print $3}' "$here/go.mod")
[ -n "$KV" ] || { echo "tests/karpenter/go.mod: no sigs.k8s.io/karpenter requirement" >&2; exit 2; }

if [ -n "${GPUPACK_KARPENTER:-}" ]; then
  [ -x "$GPUPACK_KARPENTER/karpenter-kwok" ] && [ -d "$GPUPACK_KARPENTER/crds" ] \
    || { echo "GPUPACK_KARPENTER=$GPUPACK_KARPENTER: needs an executable karpenter-kwok and a crds/ dir" >&2; exit 2; }
  echo "$GPUPACK_KARPENTER"; exit 0
fi

cache=${XDG_CACHE_HOME:-$HOME/.cache}/gpupack/karpenter/$KV
bin=$cache/karpenter-kwok
# The binary prints no version, so a stamp written after a complete build says which version it is.
if [ -x "$bin" ] && [ "$(cat "$cache/stamp" 2>/dev/null)" = "$KV" ] && [ -d "$cache/crds" ]; then
  echo "[karpenter] $KV: cached at $cache" >&2
else
  echo "[karpenter 1/2] $KV: building sigs.k8s.io/karpenter/kwok (first time only; several minutes on 2 cores)" >&2
  mkdir -p "$cache"
  t0=$(date +%s)
  # Karpenter's go.mod asks for a newer Go than some machines have: `auto` lets go fetch that toolchain
  # (a module from the Go proxy) when the local one is older.
  export CGO_ENABLED=0 GOFLAGS=-trimpath GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
  ( cd "$here" && go build -ldflags "-s -w" -o "$bin.tmp" sigs.k8s.io/karpenter/kwok ) >&2
  mv "$bin.tmp" "$bin"
  echo "    karpenter-kwok built in $(( $(date +%s) - t0 ))s" >&2
  echo "[karpenter 2/2] $KV: copying its CRDs" >&2
  src=$(cd "$here" && go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)
  rm -rf "$cache/crds.tmp" && mkdir -p "$cache/crds.tmp"
  cp "$src"/kwok/charts/crds/*.yaml "$src"/kwok/apis/crds/*.yaml "$cache/crds.tmp/"
  chmod u+w "$cache"/crds.tmp/*.yaml
  rm -rf "$cache/crds" && mv "$cache/crds.tmp" "$cache/crds"
  echo "$KV" > "$cache/stamp"
fi
echo "$cache"
