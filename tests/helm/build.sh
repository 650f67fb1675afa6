#!/usr/bin/env bash
# Build helm (helm.sh/helm/v3 cmd/helm, the version pinned in go.mod) into a per-version cache dir.
# Skips the build when the cached binary answers `helm version` with that version.
# GPUPACK_HELM=/path/to/helm skips building altogether.
# Progress goes to stderr; the last line of stdout is the helm binary path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
HV=$(awk '$1 == "helm.sh/helm/v3" {print $2}' "$here/go.mod")
[ -n "$HV" ] || { echo "tests/helm/go.mod: no helm.sh/helm/v3 requirement" >&2; exit 2; }

if [ -n "${GPUPACK_HELM:-}" ]; then
  [ -x "$GPUPACK_HELM" ] || { echo "GPUPACK_HELM=$GPUPACK_HELM: not an executable" >&2; exit 2; }
  echo "$GPUPACK_HELM"; exit 0
fi

cache=${XDG_CACHE_HOME:-$HOME/.cache}/gpupack/helm/$HV
bin=$cache/helm
ok() { # `helm version --template` prints exactly the version it was stamped with
  local v
  [ -x "$bin" ] && v=$("$bin" version --template '{{.Version}}' 2>/dev/null) && [ "$v" = "$HV" ]
}
if ok; then
  echo "[helm] $HV: cached at $bin" >&2
else
  echo "[helm] $HV: building helm.sh/helm/v3/cmd/helm (first time only; a few minutes on 2 cores)" >&2
  mkdir -p "$cache"
  t0=$(date +%s)
  export CGO_ENABLED=0 GOFLAGS=-trimpath GOTOOLCHAIN=${GOTOOLCHAIN:-local}
  # As helm's own Makefile does: the default Kubernetes version (for `helm template`/`lint` without
  # --kube-version) is the one after the client-go minor it was built with (client-go v0.37 -> 1.37).
  cg=$(awk '$1 == "k8s.io/client-go" {print $2}' "$here/go.mod")
  kmin=$(cut -d. -f2 <<<"$cg")
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HV -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in pkg/lint/rules pkg/chartutil; do
    ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$kmin"
  done
  ( cd "$here" && go build -ldflags "$ldflags" -o "$bin.tmp" helm.sh/helm/v3/cmd/helm ) >&2
  mv "$bin.tmp" "$bin"
  ok || { echo "[helm] built $bin but \`helm version\` does not answer $HV" >&2; exit 1; }
  echo "[helm] built in $(( $(date +%s) - t0 ))s" >&2
fi
echo "$bin"
