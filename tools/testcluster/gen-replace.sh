#!/usr/bin/env bash
# Prints go.mod's replace block: every staging module k8s.io/kubernetes replaces with a local path
# (`k8s.io/X => ./staging/src/k8s.io/X` in its own go.mod) pinned to the published k8s.io/X at the
# matching v0.MINOR.PATCH. Run after changing KUBE_VERSION; paste the output over the block in go.mod.
set -euo pipefail
KUBE_VERSION=${KUBE_VERSION:-v1.36.3}
STAGING_VERSION=v0.${KUBE_VERSION#v1.}
gomod=$(go env GOMODCACHE)/k8s.io/kubernetes@$KUBE_VERSION/go.mod
[ -f "$gomod" ] || go mod download k8s.io/kubernetes@"$KUBE_VERSION"
echo "replace ("
awk -v v="$STAGING_VERSION" '$2 == "=>" && $3 ~ /^\.\/staging\// {print "\t" $1 " => " $1 " " v}' "$gomod"
echo ")"
