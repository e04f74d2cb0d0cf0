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
# Go's own output (hundreds of "go: downloading" lines) goes to a log file, kept; the terminal gets one line per
# binary with its elapsed time, a heartbeat every 30 s during the long compiles, and the log's tail on failure.
build_log="$cache/build.log"
steps=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm; do
  [ -x "$bin/$b" ] || steps+=("$b")
done
step=0 started=$SECONDS
run_step() {  # run_step NAME COMMAND...: one numbered progress line before and after, Go's output to the log
  local name=$1 t=$SECONDS pid next=30
  shift
  step=$((step + 1))
  log "[$step/${#steps[@]}] $name: building (Go's output: $build_log)"
  echo "=== $name $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$build_log"
  "$@" >>"$build_log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ $((SECONDS - t)) -ge "$next" ]; then
      log "      $name: still building, $((SECONDS - t)) s ($(grep -c '^go: downloading' "$build_log" || true) modules downloaded so far)"
      next=$((next + 30))
    fi
  done
  if ! wait "$pid"; then
    log "$name FAILED after $((SECONDS - t)) s; the end of $build_log:"
    tail -n 40 "$build_log" >&2
    exit 1
  fi
  log "[$step/${#steps[@]}] $name built in $((SECONDS - t)) s"
}
if [ ${#steps[@]} -gt 0 ]; then
  mkdir -p "$cache"
  slow=""
  [ -x "$bin/kube-apiserver" ] || slow="; the Kubernetes binaries take 15-25 minutes on 2 cores"
  log "building ${steps[*]} (Kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION)" \
    "into $bin$slow"
fi
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  if [ ! -x "$bin/$b" ]; then
    run_step "$b" bash -c 'cd "$1/k8s" && go build -p 2 -trimpath -ldflags "$2" -o "$3.tmp" "./cmd/$4" && mv "$3.tmp" "$3"' \
      _ "$here" "$ldflags" "$bin/$b" "$b"
  fi
done
if [ ! -x "$bin/etcd" ]; then
  run_step etcd bash -c 'cd "$1/etcd" && go build -trimpath -ldflags "-s -w" -o "$2.tmp" . && mv "$2.tmp" "$2"' \
    _ "$here" "$bin/etcd"
fi
if [ ! -x "$bin/kwok" ]; then
  run_step kwok go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
fi
if [ ! -x "$bin/helm" ]; then
  run_step helm go install -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
fi
if [ ${#steps[@]} -gt 0 ]; then
  log "all ${#steps[@]} binaries built in $((SECONDS - started)) s"
fi
echo "$bin"
