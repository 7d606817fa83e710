#!/usr/bin/env bash
# Regenerate the operator image's hash-locked dependencies from PyPI alone (one index, no local wheels):
#   images/operator/lock.sh      (needs pip-tools: pip install pip-tools)
# requirements.in pins the runtime dependencies (the versions the test tiers run with), build.in what
# builds the package's wheel; each .lock pins every transitive dependency with the hashes of all of
# its files on PyPI, and the Dockerfile installs them with --require-hashes.
set -euo pipefail
cd "$(dirname "$0")"
for name in requirements build; do
  PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
    --index-url https://pypi.org/simple --no-emit-index-url --no-emit-find-links \
    --output-file "$name.lock" "$name.in"
done
