#!/usr/bin/env bash
# Build the serving image from the repository root:
#   images/vllm-ascend/build.sh REGISTRY/pd-vllm-ascend [REF]
# REF defaults to the seed change's pull request (refs/pull/16755/head); use a release tag
# (refs/tags/vX) once a release carries it. The ref is resolved to a commit here, passed to the build
# (which checks the fetched source is that commit and records it) and put in the image tag.
set -euo pipefail
image="${1:?usage: $0 REGISTRY/pd-vllm-ascend [REF]}"
ref="${2:-refs/pull/16755/head}"
repo="${VLLM_ASCEND_REPO:-https://github.com/vllm-project/vllm-ascend.git}"
commit="$(git ls-remote "$repo" "$ref" | awk 'NR==1 {print $1}')"
if [ -z "$commit" ]; then
  echo "$repo has no ref $ref" >&2
  exit 1
fi
# Two tags: one naming the commit (what a deployment should pin), one moving alias (what the examples name).
tag="v0.30.0rc2-seed-${commit:0:12}"
alias="v0.30.0rc2-seed"
cd "$(dirname "$0")/../.."
docker build -f images/vllm-ascend/Dockerfile \
  --build-arg VLLM_ASCEND_REPO="$repo" --build-arg VLLM_ASCEND_REF="$ref" \
  --build-arg VLLM_ASCEND_COMMIT="$commit" -t "$image:$tag" -t "$image:$alias" .
echo "$image:$tag and $image:$alias (vllm-ascend $ref = $commit)"
