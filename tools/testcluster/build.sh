#!/usr/bin/env bash
# Builds the testcluster binary into .tools/testcluster/<hash>/testcluster, where <hash> covers
# go.mod, go.sum and the Go sources: a warm run finds the binary and does nothing.
#   build.sh        build if needed, print progress during a cold build (minutes on 2 cores)
#   build.sh path   print where the binary for the current sources lives (built or not)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
hash=$(cd "$here" && cat go.mod go.sum $(ls *.go | sort) | sha256sum | cut -c1-16)
out=$root/.tools/testcluster/$hash/testcluster
if [ "${1:-}" = path ]; then echo "$out"; exit 0; fi
[ -x "$out" ] && exit 0

# Stamp the version the components report (else `kubectl version` says v0.0.0): the version of
# k8s.io/kubernetes this module requires.
kube=$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$here/go.mod")
minor=${kube#v1.}; minor=${minor%%.*}
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$kube -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
start=$(date +%s)
echo "testcluster: downloading modules ($kube, etcd, kwok)"
(cd "$here" && go mod download)
echo "testcluster: compiling kube-apiserver, controller-manager, scheduler, etcd, kwok, the kubelet and the NPU device plugin into one binary (cold: several minutes)"
mkdir -p "$(dirname "$out")"
n=0
# `go build -v` names each package as it compiles it; print a line every 250 so a cold build shows progress.
(cd "$here" && go build -v -trimpath -ldflags "$ldflags" -o "$out.tmp" . 2>&1) | while IFS= read -r line; do
  n=$((n + 1))
  case $line in *:*) echo "$line" ;; esac  # compiler errors carry file:line
  if [ $((n % 250)) = 0 ]; then echo "testcluster: $n packages compiled, $(($(date +%s) - start)) s"; fi
done
[ -x "$out.tmp" ] || { echo "testcluster: build failed" >&2; exit 1; }
mv "$out.tmp" "$out"
echo "testcluster: built $out in $(($(date +%s) - start)) s ($(du -m "$out" | cut -f1) MB)"
