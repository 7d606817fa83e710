#!/usr/bin/env bash
# Builds the real node's runtime into .tools/testnode/<hash>/ (tests/support/node.py runs it), where
# <hash> covers this script and the pause program: a warm run finds it and does nothing.
#   containerd, containerd-shim-runc-v2, ctr   github.com/containerd/containerd/v2 @ CONTAINERD_VERSION
#   cni/bridge, cni/host-local, cni/loopback, cni/portmap
#                                              github.com/containernetworking/plugins @ CNI_VERSION
#   pause                                      pause/main.go, the sandbox image's program
# Each is `go install`ed at its release with its own go.mod (static, CGO_ENABLED=0); runc comes from
# apt. The kubelet is a component of the testcluster binary (build.sh).
#   node.sh        build if needed
#   node.sh path   print the directory for the current sources (built or not)
set -euo pipefail
CONTAINERD_VERSION=v2.4.2
CNI_VERSION=v1.10.0
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
hash=$(cat "$here/node.sh" "$here/pause/main.go" | sha256sum | cut -c1-16)
out=$root/.tools/testnode/$hash
if [ "${1:-}" = path ]; then echo "$out"; exit 0; fi
[ -f "$out/.built" ] && exit 0

if ! command -v runc >/dev/null; then
  echo "testnode: installing runc (apt)"
  SUDO=$( [ "$(id -u)" = 0 ] || echo sudo )
  ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq runc) >/dev/null
fi
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
start=$(date +%s)
rm -rf "$out.tmp" && mkdir -p "$out.tmp/cni"
echo "testnode: building containerd $CONTAINERD_VERSION (cold: about 2 min)"
GOBIN=$out.tmp go install -trimpath -ldflags "-s -w" \
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
echo "testnode: building the CNI plugins $CNI_VERSION"
plugins=github.com/containernetworking/plugins/plugins
GOBIN=$out.tmp/cni go install -trimpath -ldflags "-s -w" \
  "$plugins/main/bridge@$CNI_VERSION" "$plugins/ipam/host-local@$CNI_VERSION" \
  "$plugins/main/loopback@$CNI_VERSION" "$plugins/meta/portmap@$CNI_VERSION"
(cd "$here/pause" && go build -trimpath -ldflags "-s -w" -o "$out.tmp/pause" main.go)
touch "$out.tmp/.built"
rm -rf "$out" && mv "$out.tmp" "$out"
echo "testnode: built $out in $(($(date +%s) - start)) s"
