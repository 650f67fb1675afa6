#!/usr/bin/env bash
# Regenerate go.mod/go.sum for one Kubernetes version. Run by a maintainer when bumping KV;
# the committed go.mod/go.sum are what build.sh uses.
set -euo pipefail
KV=${KV:-v1.34.10}
SV=v0.${KV#v1.}
ETCDV=${ETCDV:-v3.6.4}   # the etcd client version k8s $KV pins
cd "$(dirname "$0")"
MOD=$(cd "$(mktemp -d)" && go mod download -json "k8s.io/kubernetes@$KV" |
      python3 -c 'import sys,json;print(json.load(sys.stdin)["GoMod"])')
rm -f go.mod go.sum
go mod init gpupack.invalid/k8s-bins
go mod edit -go=1.24.0 -godebug=default=go1.24
grep -oE 'k8s\.io/[A-Za-z0-9._-]+ => \./staging/' "$MOD" | awk '{print $1}' | sort -u |
  while read -r m; do go mod edit -replace "$m=$m@$SV"; done
go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$KV" "k8s.io/kubernetes/cmd/kube-scheduler@$KV" \
             "k8s.io/kubernetes/cmd/kube-controller-manager@$KV" \
             "go.etcd.io/etcd/server/v3@$ETCDV"
go mod tidy
