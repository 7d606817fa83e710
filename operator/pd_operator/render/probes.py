"""Health probes of serving pods.

The leader (pod 0) of an instance runs vLLM's HTTP server, so it is probed on `/health`. Other
pods of a multi-pod instance run `--headless`: they have no HTTP server, but their first KV
handshake port only accepts connections once their workers have loaded the model and registered
the KV caches, so a TCP connect to it is their readiness. Because all pods of a StatefulSet share
one template, multi-pod instances use one exec probe that picks the check from the pod's ordinal;
its ports are passed as arguments (one per ordinal) so they come from the port plan.
"""

from __future__ import annotations

import math

from pd_operator.render.command import POD_INDEX_ENV
from pd_operator.spec.ports import kv_handshake
from pd_operator.spec.validate import Resolved

HEALTH_PATH = "/health"
PERIOD = 10
READY_FAILURES = 3
LIVE_PERIOD = 30
LIVE_FAILURES = 5
TIMEOUT = 5

# argv[1 + ordinal] is the port to check: HTTP /health on the leader, a TCP connect elsewhere.
_ORDINAL_CHECK = f"""\
import os, socket, sys, urllib.request
ordinal = int(os.environ["{POD_INDEX_ENV}"])
host, port = os.environ["VLLM_HOST_IP"], int(sys.argv[1 + ordinal])
if ordinal == 0:
    urllib.request.urlopen(f"http://{{host}}:{{port}}{HEALTH_PATH}", timeout={TIMEOUT}).close()
else:
    socket.create_connection((host, port), timeout={TIMEOUT}).close()
"""


def ordinal_check_ports(ctx: Resolved, role: str) -> list[int]:
    """The port each pod of an instance is probed on, by ordinal."""
    plan, kv_port = ctx.shapes[role], ctx.deployment.spec.kv_transfer.kv_port
    return [ctx.deployment.spec.serving_port,
            *(kv_handshake(kv_port, plan, o).start for o in range(1, plan.pods))]


def _handler(ctx: Resolved, role: str) -> dict:
    if not ctx.shapes[role].multi_pod:
        return {"httpGet": {"path": HEALTH_PATH, "port": "http"}}
    ports = [str(p) for p in ordinal_check_ports(ctx, role)]
    return {"exec": {"command": ["python3", "-c", _ORDINAL_CHECK, *ports]}}


def probes(ctx: Resolved, role: str) -> dict:
    handler = _handler(ctx, role)
    startup_limit = ctx.role(role).startup_timeout_seconds
    return {
        # Loading weights and compiling graphs takes long; the startup probe holds the others off.
        "startupProbe": {**handler, "periodSeconds": PERIOD, "timeoutSeconds": TIMEOUT,
                         "failureThreshold": math.ceil(startup_limit / PERIOD)},
        "readinessProbe": {**handler, "periodSeconds": PERIOD, "timeoutSeconds": TIMEOUT,
                           "failureThreshold": READY_FAILURES},
        # Modest: a busy engine may answer slowly; restarting it drops every request in flight.
        "livenessProbe": {**handler, "periodSeconds": LIVE_PERIOD, "timeoutSeconds": TIMEOUT * 2,
                          "failureThreshold": LIVE_FAILURES},
    }
