#!/usr/bin/env python3
"""A stand-in `vllm` command that records how it was started and serves nothing, so a test can run a
rendered container command to its end and compare the argv and environment `vllm` got with the
rendered ones: the argv as JSON to $PD_TEST_ARGV, the environment as JSON to $PD_TEST_ENV (each when
set; with neither, both as one JSON object on stdout); exit 0.

Standard library only: it is the `vllm` of render_cases.run_pod and of the stock-serving stand-in image
(support/images/stock-serving), where only the image's own python3 runs it.
"""

import json
import os
import sys


def main() -> None:
    argv, env = sys.argv, dict(os.environ)
    targets = [(os.environ.get("PD_TEST_ARGV"), argv), (os.environ.get("PD_TEST_ENV"), env)]
    if not any(path for path, _ in targets):
        print(json.dumps({"argv": argv, "env": env}))
    for path, value in targets:
        if path:
            with open(path, "w") as out:
                json.dump(value, out)


if __name__ == "__main__":
    main()
