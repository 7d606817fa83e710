"""The routing proxy (vllm-ascend's load-balance proxy example): each request goes to a prefill
instance, then to a decode instance with the returned kv_transfer_params (facts.md section 2)."""

from __future__ import annotations

from pd_operator.api.types import ROLES
from pd_operator.render.context import Context
from pd_operator.render.labels import labels, metadata, selector
from pd_operator.render.pod import resources

COMPONENT = "proxy"
HEALTH_PATH = "/healthcheck"


def upstreams(ctx: Context, role: str) -> list[str]:
    """The leader pod's stable DNS name of every instance of a role."""
    return [ctx.names.pod_host(role, i, 0) for i in range(ctx.role(role).replicas)]


def proxy_argv(ctx: Context) -> list[str]:
    spec = ctx.dep.spec
    port = str(spec.serving_port)
    prefill, decode = upstreams(ctx, "prefill"), upstreams(ctx, "decode")
    return ["python3", spec.proxy.script, "--host", "0.0.0.0", "--port", str(spec.proxy.port),
            "--prefiller-hosts", *prefill, "--prefiller-ports", *([port] * len(prefill)),
            "--decoder-hosts", *decode, "--decoder-ports", *([port] * len(decode))]


def service(ctx: Context) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": metadata(ctx, ctx.names.proxy, COMPONENT),
            "spec": {"selector": selector(ctx, COMPONENT),
                     "ports": [{"name": "http", "port": ctx.dep.spec.proxy.port, "targetPort": "http",
                                "protocol": "TCP"}]}}


def deployment(ctx: Context) -> dict:
    spec = ctx.dep.spec
    probe = {"httpGet": {"path": HEALTH_PATH, "port": "http"}, "periodSeconds": 10}
    container = {
        "name": "proxy",
        "image": spec.proxy.image or spec.image.name,
        "imagePullPolicy": spec.image.pull_policy,
        "command": proxy_argv(ctx),
        "ports": [{"name": "http", "containerPort": spec.proxy.port, "protocol": "TCP"}],
        "readinessProbe": probe,
        "livenessProbe": {**probe, "periodSeconds": 30, "failureThreshold": 5},
        "securityContext": {"privileged": False, "allowPrivilegeEscalation": False},
        **({"resources": r} if (r := resources(spec.proxy.resources)) else {}),
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": metadata(ctx, ctx.names.proxy, COMPONENT),
            # With no instance of a role there is nothing to route to (and the script needs at
            # least one host per list), so the proxy is scaled to zero until both roles exist.
            "spec": {"replicas": spec.proxy.replicas if all(upstreams(ctx, r) for r in ROLES) else 0,
                     "selector": {"matchLabels": selector(ctx, COMPONENT)},
                     "template": {"metadata": {"labels": labels(ctx, COMPONENT)},
                                  "spec": {"containers": [container], **ctx.pull_secrets()}}}}
