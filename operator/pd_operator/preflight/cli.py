"""`pd-preflight`: the first process of every serving container.

    pd-preflight --config /etc/pd/preflight-decode.json -- vllm serve MODEL ... --kv-transfer-config '{...}'

Gathers what only the pod knows (its argv, its environment, the NPUs the device plugin granted,
the ports already bound, what the installed vllm-ascend's source registers), lets
pd_operator.preflight.checks judge it against the rendered config and, when nothing is wrong, replaces
itself with the command (`exec`), so vLLM keeps the container's PID and signals. Any error: the
findings on stderr, one per line, and exit 78 (EX_CONFIG), so the pod fails at once with the reason
in its log instead of minutes later in a transfer.

    pd-preflight --report /dev/termination-log

writes what the image's vllm-ascend is (version, build commit, whether it has the seed change;
serving_image/installed.py `report`) to the file and exits 0: the `pd-image-report` init container
(render/tools.py), whose termination message the kubelet puts into the pod's status.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pd_operator.findings import Finding
from pd_operator.preflight.checks import ordinal_of, parse_config, preflight
from pd_operator.serving_image.installed import Installed, installed_root, introspect, report

EX_CONFIG = 78
# NPU ids the Ascend device plugin grants a container (Ascend/ascend-device-plugin: Allocate's
# container envs), narrowed by the runtime's own ASCEND_RT_VISIBLE_DEVICES when that is set.
DEVICE_ENVS = ("ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES")


def installed_vllm_ascend() -> Installed | None:
    """What the vllm_ascend package this Python would import registers, read from its source."""
    root = installed_root()
    return introspect(root) if root is not None else None


def visible_npus(env: Mapping[str, str], dev: Path = Path("/dev")) -> int | None:
    """NPUs this container may use: the device lists of DEVICE_ENVS, else /dev/davinciN."""
    for name in DEVICE_ENVS:
        listed = env.get(name)
        if listed:
            return len([d for d in listed.split(",") if d.strip()])
    devices = [p for p in dev.glob("davinci*") if re.fullmatch(r"davinci\d+", p.name)]
    return len(devices) or None


def busy(ports: Sequence[int]) -> set[int]:
    """Ports another socket of the pod listens on. Bound as vLLM binds its server socket, with
    SO_REUSEADDR (vllm-project/vllm: vllm/entrypoints/launchers/launcher.py @ v0.34.0,
    create_server_socket): connections a killed engine left in TIME_WAIT do not hold the port, so a
    restarted container starts at once rather than failing this check for a minute."""
    taken = set()
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    taken.add(port)
    return taken


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="pd-preflight", description=__doc__.splitlines()[0])
    mode = top.add_mutually_exclusive_group(required=True)
    mode.add_argument("--config", help="the rendered preflight config (JSON)")
    mode.add_argument("--report", metavar="PATH", help="write what the image's vllm-ascend is to PATH")
    top.add_argument("command", nargs=argparse.REMAINDER, help="-- and the command to exec")
    return top


def findings_for(config_path: str, argv: Sequence[str], env: Mapping[str, str]) -> list[Finding]:
    try:
        text = Path(config_path).read_text()
    except OSError as err:
        return [Finding("PreflightConfigInvalid", "error", config_path, "",
                        f"The rendered config {config_path} cannot be read: {err.strerror}.")]
    config, findings = parse_config(text, config_path)
    if config is None:
        return findings
    ordinal = ordinal_of(env) or 0
    ports = config.ports[ordinal] if ordinal < len(config.ports) else []
    installed = installed_vllm_ascend()
    if installed is not None:  # the pod log names what runs: version, build commit, source root
        print(f"pd-preflight: {installed.describe()}", file=sys.stderr)
    return preflight(config, argv, env, visible_npus(env), busy(ports), installed)


def main(args: Sequence[str] | None = None) -> int:
    ns = parser().parse_args(args)
    if ns.report:
        text = report(installed_vllm_ascend())
        print(f"pd-preflight: {text}", file=sys.stderr)
        try:
            Path(ns.report).write_text(text)
        except OSError as err:  # a report is information: its loss must not stop the pod
            print(f"pd-preflight: cannot write {ns.report}: {err.strerror}", file=sys.stderr)
        return 0
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        print("pd-preflight: no command to run (expected `-- vllm serve ...`)", file=sys.stderr)
        return EX_CONFIG
    findings = findings_for(ns.config, command, os.environ)
    for f in findings:
        print(f"pd-preflight: {f.line()}", file=sys.stderr)
    if any(f.severity == "error" for f in findings):
        return EX_CONFIG
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as err:
        print(f"pd-preflight: cannot run {command[0]}: {err.strerror}", file=sys.stderr)
        return EX_CONFIG
    return 0  # unreachable: exec replaced the process


if __name__ == "__main__":
    sys.exit(main())
