#!/usr/bin/env bash
# Build the serving image from the repository root:
#   images/vllm-ascend/build.sh REGISTRY/pd-vllm-ascend COMMIT BASE_DIGEST
# COMMIT: the vllm-ascend commit to build (40 hex digits), one a reviewer read: the head of the seed
# change's pull request (`git ls-remote https://github.com/vllm-project/vllm-ascend.git
# refs/pull/16755/head` shows it; review that diff), or a release's once one carries it.
# BASE_DIGEST: the sha256 digest of quay.io/ascend/vllm-ascend:v0.30.0rc2 as reviewed
# (`skopeo inspect --format '{{.Digest}}' docker://quay.io/ascend/vllm-ascend:v0.30.0rc2`).
# Nothing is resolved here or in the build: a moving ref or tag cannot change what is built.
set -euo pipefail
image="${1:?usage: $0 REGISTRY/pd-vllm-ascend COMMIT BASE_DIGEST}"
commit="${2:?usage: $0 REGISTRY/pd-vllm-ascend COMMIT BASE_DIGEST}"
digest="${3:?usage: $0 REGISTRY/pd-vllm-ascend COMMIT BASE_DIGEST}"
repo="${VLLM_ASCEND_REPO:-https://github.com/vllm-project/vllm-ascend.git}"
[[ "$commit" =~ ^[0-9a-f]{40}$ ]] || { echo "COMMIT must be 40 hex digits, not $commit" >&2; exit 1; }
[[ "$digest" =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "BASE_DIGEST must be sha256:<64 hex>, not $digest" >&2; exit 1; }
# Two tags: one naming the commit (what a deployment should pin, or the image's own digest), one moving
# alias (what the examples name).
tag="v0.30.0rc2-seed-${commit:0:12}"
alias="v0.30.0rc2-seed"
cd "$(dirname "$0")/../.."
docker build -f images/vllm-ascend/Dockerfile \
  --build-arg VLLM_ASCEND_BASE_DIGEST="$digest" \
  --build-arg VLLM_ASCEND_REPO="$repo" --build-arg VLLM_ASCEND_COMMIT="$commit" -t "$image:$tag" -t "$image:$alias" .
echo "$image:$tag and $image:$alias (vllm-ascend $commit on $digest)"
