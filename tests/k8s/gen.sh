#!/usr/bin/env bash
# Generate mod/<KV>/go.mod + go.sum: a Go module that builds kube-apiserver, kube-scheduler,
# kube-controller-manager, kubelet (all at KV) and the etcd server k8s KV pins. build.sh runs it when the
# version in VERSION has no module yet (needs the Go module proxy); commit the result.
set -euo pipefail
cd "$(dirname "$0")"
KV=${KV:-$(tr -d '[:space:]' < VERSION)}
SV=v0.${KV#v1.}
MOD=$(cd "$(mktemp -d)" && go mod download -json "k8s.io/kubernetes@$KV" |
      python3 -c 'import sys,json;print(json.load(sys.stdin)["GoMod"])')
# The etcd server version is the etcd client version k8s KV requires.
ETCDV=${ETCDV:-$(awk '$1=="go.etcd.io/etcd/client/v3"{print $2; exit}' "$MOD")}
GOV=$(awk '$1=="go"{print $2; exit}' "$MOD")
mkdir -p "mod/$KV"
cd "mod/$KV"
rm -f go.mod go.sum
go mod init gpupack.invalid/k8s-bins
go mod edit -go="$GOV" -godebug="default=go${GOV%.*}"
grep -oE 'k8s\.io/[A-Za-z0-9._-]+ => \./staging/' "$MOD" | awk '{print $1}' | sort -u |
  while read -r m; do go mod edit -replace "$m=$m@$SV"; done
go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$KV" "k8s.io/kubernetes/cmd/kube-scheduler@$KV" \
             "k8s.io/kubernetes/cmd/kube-controller-manager@$KV" "k8s.io/kubernetes/cmd/kubelet@$KV" \
             "go.etcd.io/etcd/server/v3@$ETCDV"
go mod tidy
echo "$ETCDV" > ETCD_VERSION
