#!/usr/bin/env bash
# Regenerate the images' hash-locked dependencies from PyPI alone (one index, no local wheels):
#   images/lock.sh      (needs pip-tools: pip install pip-tools)
# Each .in pins what an image installs; each .lock pins every transitive dependency with the hashes of
# all of its files on PyPI, and the Dockerfiles install them with --require-hashes.
#   operator/requirements.in   the operator's runtime dependencies (the versions the test tiers run with)
#   operator/build.in          what builds the package's wheel
#   vllm-ascend/requirements.in  the two base dependencies vLLM lacks; the serving image installs the
#                              lock's entries its base lacks (vllm-ascend/base_lacks.py)
# The resolution is this Python's (3.11); the serving base's 3.12 takes the same dependencies (no
# marker of these packages separates the two).
set -euo pipefail
cd "$(dirname "$0")"
for name in operator/requirements operator/build vllm-ascend/requirements; do
  (cd "$(dirname "$name")" && PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= pip-compile --quiet --generate-hashes \
    --allow-unsafe --strip-extras --index-url https://pypi.org/simple --no-emit-index-url --no-emit-find-links \
    --output-file "$(basename "$name").lock" "$(basename "$name").in")
done
