"""The Mooncake metadata discovery objects: the JSON config (http and etcd modes) and, for http, the
metadata server Deployment and Service (facts.md section 3).

P2PHANDSHAKE renders nothing: peers exchange metadata directly. With a metadata server every
transfer engine registers under its `local_hostname`, and two engines with the same one collide
(`Duplicate rpc_meta key`, facts.md section 4). The ConfigMap therefore holds a template with a
placeholder that each pod replaces with its own IP when it starts (see command.py), so one
ConfigMap serves every pod without a per-pod object.
"""

from __future__ import annotations

import json

from pd_operator.render.context import Context
from pd_operator.render.labels import labels, metadata, selector

TEMPLATE_DIR = "/etc/pd-mooncake"
CONFIG_KEY = "mooncake.json"
RUNTIME_DIR = "/var/run/pd"
CONFIG_PATH = f"{RUNTIME_DIR}/{CONFIG_KEY}"
POD_IP_PLACEHOLDER = "@POD_IP@"
COMPONENT = "metadata"
SERVER_COMMAND = "mooncake_http_metadata_server"  # console script of the Mooncake wheel in the image


def metadata_server_url(ctx: Context) -> str:
    meta = ctx.dep.spec.kv_transfer.metadata
    if meta.mode == "etcd":
        return f"etcd://{meta.etcd_endpoint}"
    if meta.mode == "http":
        host = f"{ctx.names.metadata_server}.{ctx.dep.namespace}.svc"
        return f"http://{host}:{meta.server_port}/metadata"
    return "P2PHANDSHAKE"


def config_map(ctx: Context) -> dict:
    config = {"local_hostname": POD_IP_PLACEHOLDER, "metadata_server": metadata_server_url(ctx),
              "protocol": ctx.dep.spec.kv_transfer.protocol, "device_name": ""}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata(ctx, ctx.names.mooncake_config, COMPONENT),
            "data": {CONFIG_KEY: json.dumps(config, indent=2) + "\n"}}


def server_service(ctx: Context) -> dict:
    port = ctx.dep.spec.kv_transfer.metadata.server_port
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": metadata(ctx, ctx.names.metadata_server, COMPONENT),
            "spec": {"selector": selector(ctx, COMPONENT),
                     "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]}}


def server_deployment(ctx: Context) -> dict:
    spec = ctx.dep.spec
    port = spec.kv_transfer.metadata.server_port
    probe = {"tcpSocket": {"port": "http"}, "periodSeconds": 10}
    container = {
        "name": "metadata",
        "image": spec.image.name,
        "imagePullPolicy": spec.image.pull_policy,
        "command": [SERVER_COMMAND, "--host", "0.0.0.0", "--port", str(port)],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": probe,
        "livenessProbe": {**probe, "failureThreshold": 6},
        "securityContext": {"privileged": False, "allowPrivilegeEscalation": False},
    }
    # One replica: the server keeps the metadata in memory, so replicas would not share it.
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": metadata(ctx, ctx.names.metadata_server, COMPONENT),
            "spec": {"replicas": 1, "selector": {"matchLabels": selector(ctx, COMPONENT)},
                     "template": {"metadata": {"labels": labels(ctx, COMPONENT)},
                                  "spec": {"containers": [container], **ctx.pull_secrets()}}}}

