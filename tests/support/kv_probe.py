"""`pd-kv-probe` processes on loopback for the transfer tier: the command, its environment, and a
`serve` side started and waited for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support.cluster import pick_port

PROBE = [sys.executable, "-m", "pd_operator.transfer.probe"]
ENV_LOOPBACK = {"MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_LOG_LEVEL": "ERROR"}
LOOPBACK = ["--local-hostname", "127.0.0.1"]


def env() -> dict[str, str]:
    return {**os.environ, **ENV_LOOPBACK}


def serve(pairing: list[str]) -> tuple[subprocess.Popen, str]:
    """A `pd-kv-probe serve` of `pairing`, once its buffer is registered: (process, host:port)."""
    port = pick_port()
    proc = subprocess.Popen([*PROBE, "serve", *pairing, *LOOPBACK,
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env())
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed once the buffer is registered and the endpoint is up
    assert line, f"serve exited with {proc.wait()}"
    assert json.loads(line)["serving"] == f"http://127.0.0.1:{port}/descriptor"
    return proc, f"127.0.0.1:{port}"
