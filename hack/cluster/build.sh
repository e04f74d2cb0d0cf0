#!/usr/bin/env bash
# Builds the local cluster's binaries from the Go module proxy into a cache keyed by versions.
# Prints the bin folder. A second run with the cache present returns at once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=v1.37.2; ETCD_VERSION=v3.6.16; KWOK_VERSION=v0.8.0; HELM_VERSION=v3.22.0
cache=${TAILTUNE_CACHE:-$HOME/.cache/tailtune}
bin="$cache/cluster-k8s${K8S_VERSION}-etcd${ETCD_VERSION}-kwok${KWOK_VERSION}-helm${HELM_VERSION}/bin"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 GOBIN="$bin"
mkdir -p "$bin"
minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor} -X k8s.io/component-base/version.gitTreeState=clean"
log() { echo "[build] $*" >&2; }
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  if [ ! -x "$bin/$b" ]; then
    log "building $b $K8S_VERSION"; t=$SECONDS
    (cd "$here/k8s" && go build -p 2 -trimpath -ldflags "$ldflags" -o "$bin/$b.tmp" "./cmd/$b" && mv "$bin/$b.tmp" "$bin/$b")
    log "$b built in $((SECONDS - t)) s"
  fi
done
if [ ! -x "$bin/etcd" ]; then
  log "building etcd $ETCD_VERSION"; t=$SECONDS
  (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" . && mv "$bin/etcd.tmp" "$bin/etcd")
  log "etcd built in $((SECONDS - t)) s"
fi
if [ ! -x "$bin/kwok" ]; then
  log "installing kwok $KWOK_VERSION"; t=$SECONDS
  go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
  log "kwok installed in $((SECONDS - t)) s"
fi
if [ ! -x "$bin/helm" ]; then
  log "installing helm $HELM_VERSION"; t=$SECONDS
  go install -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
  log "helm installed in $((SECONDS - t)) s"
fi
echo "$bin"
