#!/usr/bin/env bash
# Build kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, etcd and kwok for the Kubernetes
# version in VERSION (the one-line switch) into a per-version cache dir, from the Go module in mod/<version>
# (gen.sh makes it when missing). Skips the build when the cached binaries answer --version.
# GPUPACK_K8S_BIN=/path/with/binaries skips building altogether.
# Prints the bin dir as the last line of stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KV=$(tr -d '[:space:]' < "$here/VERSION")
KWOKV=v0.7.0

if [ -n "${GPUPACK_K8S_BIN:-}" ]; then
  for b in kube-apiserver kube-scheduler kube-controller-manager etcd kwok; do  # kubelet: only the real-node tier
    [ -x "$GPUPACK_K8S_BIN/$b" ] || { echo "GPUPACK_K8S_BIN=$GPUPACK_K8S_BIN: missing executable $b" >&2; exit 2; }
  done
  echo "$GPUPACK_K8S_BIN"; exit 0
fi

mod="$here/mod/$KV"
if [ ! -f "$mod/go.mod" ]; then
  echo "[k8s-bins] no Go module for $KV yet: generating $mod (tests/k8s/gen.sh)" >&2
  KV=$KV bash "$here/gen.sh" >&2
fi
ETCDV=$(tr -d '[:space:]v' < "$mod/ETCD_VERSION")   # the etcd server k8s $KV pins
cache=${XDG_CACHE_HOME:-$HOME/.cache}/gpupack/k8s/$KV-kwok-$KWOKV
mkdir -p "$cache"
ok() { # ok NAME EXPECTED-VERSION-LINE-REGEX (anchored, so v1.34.10 does not accept v1.34.100)
  # Capture first: with pipefail, `grep -q` closing the pipe early could SIGPIPE the binary and fail the check.
  local v
  [ -x "$cache/$1" ] && v=$("$cache/$1" --version 2>/dev/null) && grep -qE -- "^$2\$" <<<"$v"
}
step=0; total=6
progress() { step=$((step + 1)); echo "[k8s-bins $step/$total] $*" >&2; }

export CGO_ENABLED=0 GOFLAGS=-trimpath GOTOOLCHAIN=${GOTOOLCHAIN:-local}
MIN=$(echo "$KV" | cut -d. -f2)
V="-X k8s.io/component-base/version.gitVersion=$KV -X k8s.io/component-base/version.gitMajor=1
   -X k8s.io/component-base/version.gitMinor=$MIN -X k8s.io/component-base/version.gitTreeState=clean
   -X k8s.io/component-base/version.buildDate=2025-01-01T00:00:00Z
   -X k8s.io/client-go/pkg/version.gitVersion=$KV -X k8s.io/client-go/pkg/version.gitMajor=1
   -X k8s.io/client-go/pkg/version.gitMinor=$MIN"

build() { # build NAME PKG VERSION-CHECK LDFLAGS
  local name=$1 pkg=$2 check=$3 ldflags=$4 t0
  if ok "$name" "$check"; then progress "$name: cached"; return; fi
  progress "$name: building $pkg (first time only; several minutes on 2 cores)"
  t0=$(date +%s)
  ( cd "$mod" && go build -ldflags "-s -w $ldflags" -o "$cache/$name.tmp" "$pkg" ) >&2
  mv "$cache/$name.tmp" "$cache/$name"
  echo "    $name built in $(( $(date +%s) - t0 ))s" >&2
}

# Version lines: "etcd Version: 3.7.0", "Kubernetes v1.37.2", "kwok version v0.7.0 go1.26.8 (linux/amd64)".
build etcd go.etcd.io/etcd/server/v3 "etcd Version: $ETCDV" ""
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "Kubernetes $KV" "$V"
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "Kubernetes $KV" "$V"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "Kubernetes $KV" "$V"
build kubelet k8s.io/kubernetes/cmd/kubelet "Kubernetes $KV" "$V"
if ok kwok "kwok version $KWOKV .*"; then progress "kwok: cached"; else
  progress "kwok: go install sigs.k8s.io/kwok/cmd/kwok@$KWOKV"
  t0=$(date +%s)
  ( cd "$(mktemp -d)" && GOBIN="$cache" go install -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOKV" "sigs.k8s.io/kwok/cmd/kwok@$KWOKV" ) >&2
  echo "    kwok built in $(( $(date +%s) - t0 ))s" >&2
fi
echo "$cache"
