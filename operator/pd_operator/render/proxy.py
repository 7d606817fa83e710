"""The routing proxy: `pd-proxy` (pd_operator.proxy) sends each request to a prefill instance,
then to a decode instance with the returned kv_transfer_params, as vllm-ascend's example proxy does
(vllm-project/vllm-ascend: examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py
@ v0.30.0rc2).

Which instances it routes to lives in the ConfigMap `<name>-proxy` (pd_operator.proxy.membership), not
in the pod template: the proxy watches it through the API with its own ServiceAccount
(render/proxy_access.py, proxy/watch.py) and re-reads the mounted file as the fallback, so a scale
event or a gate (KV link, layout roll; controller/gate.py) changes the ConfigMap only and the
Deployment never rolls.
"""

from __future__ import annotations

import json

from pd_operator.api.types import ROLES, Resources
from pd_operator.proxy import membership, options
from pd_operator.proxy.membership import KEY, MOUNT_DIR, Membership, Upstream, instance_url, parse_text
from pd_operator.render import security, tools
from pd_operator.render.env import secret_env
from pd_operator.render.labels import labels, metadata, selector
from pd_operator.render.resources import resources
from pd_operator.spec.validate import Resolved

COMPONENT = "proxy"
HEALTH_PATH = "/healthcheck"
"""Readiness: 200 only with a prefill and a decode member."""
LIVE_PATH = membership.STATE_PATH
"""Liveness, on the admin port: answers whenever the process serves, members or not (no members is
not a crash)."""
ADMIN_PORT_NAME = "admin"
METRICS_PORT_NAME = "metrics"
VOLUME = "membership"


def upstream(ctx: Resolved, role: str, index: int, layout: str) -> Upstream:
    """An instance as the proxy reaches it: its leader pod's stable DNS name and serving port, and the
    KV layout its pods run; a prefill's also what prefix routing needs (proxy/prefix_routing.py)."""
    url = instance_url(ctx.names, role, index, ctx.deployment.spec.serving_port)
    routing = ctx.deployment.spec.proxy.routing
    if role != "prefill" or routing.prefix == "off":
        return Upstream(ctx.names.instance(role, index), url, layout)
    # The block is known for the wanted layout only: an instance of another (a rollout's old one) is
    # routed by load, never by a guessed block.
    block = ctx.prefix_hit_tokens(role) if layout == ctx.layout_hash else None
    return Upstream(ctx.names.instance(role, index), url, layout, block,
                    routing.prefill_cache_blocks if block else None,
                    kv_events_endpoints(ctx, role, index) if block else ())


def kv_events_endpoints(ctx: Resolved, role: str, index: int) -> tuple[str, ...]:
    """Where an instance's DP ranks publish KV events, in rank order: rank r on the pod that runs it,
    at the events port + r (spec/ports.py kv_events); () when its role publishes none."""
    port, plan = ctx.kv_events_port(role), ctx.shapes[role]
    if port is None:
        return ()
    return tuple(f"tcp://{ctx.names.pod_host(role, index, rank // plan.dp_local)}:{port + rank}"
                 for rank in range(plan.dp))


Routable = dict[str, dict[int, str]]
"""Per role, the indexes of the instances the proxy may route to, each with the kv-layout hash its
pods run (a rollout that changes the layout has both for a while)."""


def every_instance(ctx: Resolved) -> Routable:
    """Every instance of both roles, on the wanted layout."""
    return {role: dict.fromkeys(range(n), ctx.layout_hash) for role, n in ctx.replicas().items()}


def membership_document(ctx: Resolved, routable: Routable | None = None) -> dict:
    """The membership listing `routable` (None: every instance of both roles)."""
    wanted = routable if routable is not None else every_instance(ctx)
    lists = ([upstream(ctx, role, i, layout) for i, layout in sorted(wanted[role].items())] for role in ROLES)
    return membership.document(*lists)


def membership_config_map(ctx: Resolved, routable: Routable | None = None) -> dict:
    """The ConfigMap the proxy reads its membership from."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata(ctx, ctx.names.proxy_membership, COMPONENT),
            "data": membership_data(membership_document(ctx, routable))}


def membership_volume(ctx: Resolved) -> tuple[dict, dict]:
    """(the pod volume, the container mount) of the membership ConfigMap: the proxy routes by it,
    and the decode pods' KV-link gates link exactly the prefill instances it lists
    (render/kv_probe.py). A whole-directory mount: the kubelet updates it in place (a subPath mount
    never would)."""
    return ({"name": VOLUME, "configMap": {"name": ctx.names.proxy_membership}},
            {"name": VOLUME, "mountPath": MOUNT_DIR, "readOnly": True})


def membership_data(doc: dict) -> dict[str, str]:
    """The ConfigMap's data for a membership document."""
    return {KEY: json.dumps(doc, indent=2, sort_keys=True) + "\n"}


def members(config_map: dict) -> Membership | None:
    """The membership a proxy ConfigMap holds (None: it holds none that parses)."""
    try:
        return parse_text((config_map.get("data") or {})[KEY])
    except (KeyError, ValueError):
        return None


def proxy_argv(ctx: Resolved) -> list[str]:
    """The proxy's command: its ports, its bounds, and the deployment whose instances its membership
    may name (proxy/membership.py InstanceAddresses)."""
    spec = ctx.deployment.spec
    proxy = spec.proxy
    return ["pd-proxy", "--membership", f"{MOUNT_DIR}/{KEY}",
            "--membership-configmap", ctx.names.proxy_membership, "--host", "0.0.0.0",
            "--port", str(proxy.port), "--admin-port", str(proxy.admin_port),
            "--metrics-port", str(proxy.metrics_port), "--deployment", ctx.deployment.name,
            "--namespace", ctx.deployment.namespace, "--serving-port", str(spec.serving_port),
            "--prefix-routing", proxy.routing.prefix, *options.argv(proxy.limits)]


def service(ctx: Resolved) -> dict:
    """The clients' port only: the admin port is for the operator, which dials each pod."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": metadata(ctx, ctx.names.proxy, COMPONENT),
            "spec": {"selector": selector(ctx, COMPONENT),
                     "ports": [{"name": "http", "port": ctx.deployment.spec.proxy.port, "targetPort": "http",
                                "protocol": "TCP"}]}}


DEFAULT_REQUESTS = {"cpu": "500m", "memory": "256Mi"}
DEFAULT_LIMITS = {"memory": "1Gi"}
"""Under the default limits (api/types.py ProxyLimits) the proxy stays under about 3 x
maxBufferedBytes + 100 MiB (384 + 100 MiB); no CPU limit, so a burst is not throttled."""


def proxy_resources(spec: Resources) -> dict:
    """The user's proxy resources over the defaults, key by key."""
    return resources(Resources(requests={**DEFAULT_REQUESTS, **spec.requests},
                               limits={**DEFAULT_LIMITS, **spec.limits}))


def deployment(ctx: Resolved, admin_token: str | None = None) -> dict:
    """The same for every instance count and gate: what to route to is in the ConfigMap.
    `admin_token`: what the admin port wants (render/policy.py admin_token), the liveness probe too."""
    spec = ctx.deployment.spec
    volume, mount = membership_volume(ctx)
    env = secret_env(spec.proxy.api_key, options.API_KEY_ENV)
    live: dict = {"path": LIVE_PATH, "port": ADMIN_PORT_NAME}
    if admin_token:
        env.append({"name": options.ADMIN_TOKEN_ENV, "value": admin_token})
        live["httpHeaders"] = [{"name": "Authorization", "value": f"Bearer {admin_token}"}]
    container = {
        "name": "proxy",
        "image": ctx.proxy_image(),
        "imagePullPolicy": ctx.serving_pull_policy() if spec.proxy.image else tools.pull_policy(ctx),
        "command": proxy_argv(ctx),
        **({"env": env} if env else {}),
        "ports": [{"name": "http", "containerPort": spec.proxy.port, "protocol": "TCP"},
                  {"name": ADMIN_PORT_NAME, "containerPort": spec.proxy.admin_port, "protocol": "TCP"},
                  {"name": METRICS_PORT_NAME, "containerPort": spec.proxy.metrics_port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": HEALTH_PATH, "port": "http"}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": live, "periodSeconds": 30,
                          "failureThreshold": 5},
        "volumeMounts": [mount],
        "securityContext": dict(security.PROXY),
        "resources": proxy_resources(spec.proxy.resources),
    }
    pod_spec: dict = {"containers": [container], "volumes": [volume], **api_identity(ctx),
                      **ctx.pull_secrets()}
    pod_spec |= security.pod_fields(pod_spec, non_root=True)
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": metadata(ctx, ctx.names.proxy, COMPONENT),
            "spec": {"replicas": spec.proxy.replicas,
                     "selector": {"matchLabels": selector(ctx, COMPONENT)},
                     "template": {"metadata": {"labels": labels(ctx, COMPONENT)},
                                  "spec": pod_spec}}}


def api_identity(ctx: Resolved) -> dict:
    """The proxy pod's own ServiceAccount, its token mounted: the one pod of a PDDeployment that
    talks to the API (its membership watch)."""
    return {"serviceAccountName": ctx.names.proxy_access, "automountServiceAccountToken": True}
