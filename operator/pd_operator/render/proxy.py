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
from collections.abc import Mapping
from dataclasses import dataclass

from pd_operator.api.types import ROLES, Resources
from pd_operator.names import Names
from pd_operator.preflight.checks import flag_values
from pd_operator.proxy import membership, options
from pd_operator.proxy.membership import (
    KEY,
    MOUNT_DIR,
    Membership,
    Upstream,
    instance_url,
    paired_as,
    parse_text,
)
from pd_operator.render import command, security, tools
from pd_operator.render.env import secret_env
from pd_operator.render.labels import labels, metadata, selector
from pd_operator.render.resources import resources
from pd_operator.spec.reserved import PREFIX_CACHING_FLAGS, PREFIX_CACHING_ON, flag_name
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


@dataclass(frozen=True)
class Prefix:
    """What prefix routing needs of a prefill instance, as its engines run."""

    block_tokens: int
    """Tokens of one of its prefix-cache blocks (membership `blockTokens`)."""
    events: tuple[str, ...] = ()
    """Its DP ranks' KV-events publishers (membership `events`; precise mode only)."""


Prefixes = Mapping[int, Prefix | None]
"""Per prefill instance whose pods run another revision than the spec's (a rollout's old ones): prefix
routing as that revision's engines run it (recorded_prefix, from the instance's revision record:
controller/gate.py own_prefixes), None when that cannot be known or they cache no prefixes."""


def upstream(ctx: Resolved, role: str, index: int, layout: str, own: Prefixes | None = None,
             pairs: Mapping[str, str] | None = None) -> Upstream:
    """An instance as the proxy reaches it: its leader pod's stable DNS name and serving port, and the
    KV layout its pods run; a prefill's also what prefix routing needs (proxy/prefix_routing.py): as
    `own` has it for an instance it lists, else the spec's. `pairs`: layouts that pair as another
    (render/workloads.py Templates.pairs): a prefill's layout pairing as the spec's is the spec's but
    for decode's block, which prefix routing does not read."""
    url = instance_url(ctx.names, role, index, ctx.deployment.spec.serving_port)
    routing = ctx.deployment.spec.proxy.routing
    if role != "prefill" or routing.prefix == "off":
        return Upstream(ctx.names.instance(role, index), url, layout)
    spec_layout = paired_as(pairs or {}, layout) == paired_as(pairs or {}, ctx.layout_hash)
    if own is not None and index in own:
        # Another revision's engines: their own block and publishers. prefillCacheBlocks counts the
        # blocks of engines of the spec's KV layout: it holds for theirs only on that layout (an env
        # change), else the proxy's default bound applies.
        prefix = own[index]
        blocks = routing.prefill_cache_blocks if spec_layout else None
    else:
        # Without a record to read, an instance of another layout is routed by load, never by a
        # guessed block.
        prefix = spec_prefix(ctx, index) if spec_layout else None
        blocks = routing.prefill_cache_blocks
    if prefix is None:
        return Upstream(ctx.names.instance(role, index), url, layout)
    return Upstream(ctx.names.instance(role, index), url, layout, prefix.block_tokens, blocks, prefix.events)


def spec_prefix(ctx: Resolved, index: int) -> Prefix | None:
    """Prefix routing as the spec's prefill engines run it (None: they cache no prefixes)."""
    block = ctx.prefix_hit_tokens("prefill")
    return Prefix(block, kv_events_endpoints(ctx, "prefill", index)) if block else None


def kv_events_endpoints(ctx: Resolved, role: str, index: int) -> tuple[str, ...]:
    """Where an instance's DP ranks publish KV events, in rank order: rank r on the pod that runs it,
    at the events port + r (spec/ports.py kv_events); () when its role publishes none."""
    port, plan = ctx.kv_events_port(role), ctx.shapes[role]
    return publishers(ctx.names, role, index, port, plan.dp, plan.dp_local)


def publishers(names: Names, role: str, index: int, port: int | None, dp: int, dp_local: int
               ) -> tuple[str, ...]:
    """`dp` ranks publishing at `port` + rank, `dp_local` to a pod, in rank order (() without a port)."""
    if port is None:
        return ()
    return tuple(f"tcp://{names.pod_host(role, index, rank // dp_local)}:{port + rank}" for rank in range(dp))


def recorded_prefix(ctx: Resolved, index: int, stateful_set: dict) -> Prefix | None:
    """Prefix routing as prefill instance `index`'s engines run it, read from the `vllm serve` argv of
    the StatefulSet they run (render/command.py serve_argv_of; a revision record's): the block is its
    `--block-size` (the engine block the operator resolved for that revision, which vLLM keeps) when
    it caches prefixes, its publishers those of its `--kv-events-config` over its DP ranks. None when
    it caches none, or the argv does not say for certain (no `--block-size`, an abbreviated
    prefix-caching flag)."""
    argv = command.serve_argv_of(stateful_set)
    if argv is None or not _prefix_caching(argv):
        return None
    values = flag_values(argv)
    try:
        block = int(values["--block-size"])
        dp = int(values.get("--data-parallel-size", "1"))
        dp_local = int(values.get("--data-parallel-size-local", str(dp)))
        events = json.loads(values["--kv-events-config"]) if "--kv-events-config" in values else {}
        on = events.get("enable_kv_cache_events")
        port = int(str(events["endpoint"]).rsplit(":", 1)[1]) if on else None
    except (KeyError, ValueError, IndexError, TypeError, AttributeError):
        return None
    if block < 1 or dp < 1 or dp_local < 1:
        return None
    precise = ctx.deployment.spec.proxy.routing.prefix == "precise"  # only that mode subscribes
    return Prefix(block, publishers(ctx.names, "prefill", index, port if precise else None, dp, dp_local))


def _prefix_caching(argv: list[str]) -> bool | None:
    """Whether an engine with `argv` caches prefixes: the last of the two flags (argparse's
    BooleanOptionalAction), else vLLM's default, on (vllm-project/vllm: vllm/config/cache.py
    CacheConfig.enable_prefix_caching @ v0.34.0; render/command.py renders one for every hybrid model).
    None when a word abbreviates either flag (argparse reads it as the flag it uniquely starts)."""
    caching = True
    for arg in argv:
        name = flag_name(arg)
        if name in PREFIX_CACHING_FLAGS:
            caching = name == PREFIX_CACHING_ON
        elif name and len(name) > 2 and any(flag.startswith(name) for flag in PREFIX_CACHING_FLAGS):
            return None
    return caching


Routable = dict[str, dict[int, str]]
"""Per role, the indexes of the instances the proxy may route to, each with the kv-layout hash its
pods run (a rollout that changes the layout has both for a while)."""


def every_instance(ctx: Resolved) -> Routable:
    """Every instance of both roles, on the wanted layout."""
    return {role: dict.fromkeys(range(n), ctx.layout_hash) for role, n in ctx.replicas().items()}


def membership_document(ctx: Resolved, routable: Routable | None = None, own: Prefixes | None = None,
                        pairs: Mapping[str, str] | None = None) -> dict:
    """The membership listing `routable` (None: every instance of both roles); `own`: the prefix
    routing of the prefill instances on another revision than the spec's (Prefixes); `pairs`: layouts
    that pair as another (render/workloads.py Templates.pairs)."""
    wanted = routable if routable is not None else every_instance(ctx)
    prefill, decode = ([upstream(ctx, role, i, layout, own, pairs)
                        for i, layout in sorted(wanted[role].items())] for role in ROLES)
    return membership.document(prefill, decode, pairs)


def membership_config_map(ctx: Resolved, routable: Routable | None = None, own: Prefixes | None = None,
                          pairs: Mapping[str, str] | None = None) -> dict:
    """The ConfigMap the proxy reads its membership from."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata(ctx, ctx.names.proxy_membership, COMPONENT),
            "data": membership_data(membership_document(ctx, routable, own, pairs))}


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
