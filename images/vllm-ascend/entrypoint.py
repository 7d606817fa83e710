#!/usr/bin/env python3
"""Serving-pod entrypoint: preflight checks, then `exec` the command (normally `vllm serve ...`).

    entrypoint.py vllm serve MODEL --tensor-parallel-size 8 ... --kv-transfer-config '{...}'

Reads the operator's rendered config ($PD_PREFLIGHT_CONFIG, default
/etc/pd-operator/preflight.json), gathers what only the pod knows (what the installed vllm-ascend's
source registers, /dev/davinci* NPUs, ports already bound) and lets pd_operator.preflight judge
it. Any error: the findings on stderr and exit 78 (EX_CONFIG), so the pod fails fast with the
reason in its log instead of failing later mid-transfer.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import sys
from pathlib import Path

from pd_operator.image_check import Installed, installed_root, introspect
from pd_operator.preflight import CONFIG_ENV, DEFAULT_CONFIG_PATH, parse_config, preflight

EX_CONFIG = 78


def installed_vllm_ascend() -> Installed | None:
    root = installed_root()
    return introspect(root) if root is not None else None


def visible_npus() -> int | None:
    """NPUs this container may use: ASCEND_RT_VISIBLE_DEVICES, else /dev/davinciN; None if unknown."""
    listed = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if listed:
        return len([d for d in listed.split(",") if d.strip()])
    devices = [p for p in Path("/dev").glob("davinci*") if re.fullmatch(r"davinci\d+", p.name)]
    return len(devices) or None


def busy(ports: list[int]) -> set[int]:
    taken = set()
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    taken.add(port)
    return taken


def main(argv: list[str]) -> int:
    if not argv:
        print("entrypoint: no command to run (expected `vllm serve ...`)", file=sys.stderr)
        return EX_CONFIG
    path = os.environ.get(CONFIG_ENV, DEFAULT_CONFIG_PATH)
    try:
        text = Path(path).read_text()
    except OSError as err:
        print(f"error: PreflightConfigInvalid at {path}: the rendered config cannot be read: "
              f"{err.strerror}.", file=sys.stderr)
        return EX_CONFIG
    config, findings = parse_config(text, path)
    if config is not None:
        installed = installed_vllm_ascend()
        if installed is not None:  # the pod log names what runs: version, build commit, source root
            print(f"preflight: {installed.describe()}", file=sys.stderr)
        findings = preflight(config, argv, installed, visible_npus(), busy(config.ports))
    errors = [f for f in findings if f.severity == "error"]
    for f in findings:
        print(f.line(), file=sys.stderr)
    if errors:
        return EX_CONFIG
    sys.stderr.flush()
    os.execvp(argv[0], argv)
    return 0  # unreachable: exec replaced the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
