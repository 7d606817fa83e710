"""Render a validated PDDeployment into the Kubernetes objects that run it: pure, no I/O, no clock.

`render(resolved, routable=...)` returns the manifests in apply order: the roles' PDRoles (what
scalers scale, see render/pdroles.py), the roles' revision configs (immutable) and the proxy's (or
without it the decode gates' peers) ConfigMap, Services, the proxy's
ServiceAccount, Role and RoleBinding, the PodGroups that gang-schedule the instances
(spec.scheduling.gang), the serving StatefulSets, the proxy, the NetworkPolicy, the
PodDisruptionBudgets and the roles' HPAs. PodGroups come before the StatefulSets: when the cluster
lacks their API, the apply stops before any pod is created.
Owner references are left to the controller, which adopts what it applies.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping

from pd_operator.api.types import ROLES
from pd_operator.render import proxy, scheduling, serving_config
from pd_operator.render.autoscaling import autoscalers
from pd_operator.render.pdroles import pd_role
from pd_operator.render.policy import (
    CHART_DEFAULT,
    Boundary,
    admin_token,
    disruption_budget,
    network_policy,
    proxy_network_policy,
)
from pd_operator.render.proxy import Prefixes, Routable
from pd_operator.render.proxy_access import proxy_access
from pd_operator.render.workloads import Templates, headless_service, stateful_set, templates
from pd_operator.spec.validate import Resolved

__all__ = ["Boundary", "Prefixes", "Routable", "render"]


def render(ctx: Resolved, routable: Routable | None = None, boundary: Boundary = CHART_DEFAULT,
           surge: Mapping[str, Collection[int]] | None = None, rendered: Templates | None = None,
           own: Prefixes | None = None) -> list[dict]:
    """`routable`: the instances the proxy's membership lists (controller/gate.py); None: every one.
    `own`: the prefix routing of its prefill instances on another revision than the spec's
    (render/proxy.py Prefixes; controller/gate.py own_prefixes).
    `boundary`: the operator's namespace and the metrics scrapers the NetworkPolicies admit
    (render/policy.py).
    `surge`: per role, the indices of extra instances a rollout runs past the spec's (controller/rollout.py).
    `rendered`: templates(ctx) when the caller has them (the controller does); None: rendered here. A
    role's own objects are rendered from its templates' source (Templates.sources), so they carry the
    kv-layout its pods run."""
    rendered = rendered or templates(ctx)
    proxy_on = ctx.deployment.spec.proxy.enabled
    instances = ctx.instances(surge)
    out: list[dict] = [pd_role(rendered.sources[role], role) for role in ROLES]
    out += [rendered.configs[role] for role in ROLES]
    if not proxy_on:
        out.append(serving_config.peers_config_map(ctx))
    if proxy_on:
        out.append(proxy.membership_config_map(ctx, routable, own, rendered.pairs))
    out += [headless_service(rendered.sources[role], role, i) for role, i in instances]
    if proxy_on:
        out += [proxy.service(ctx), *proxy_access(ctx)]
    out += [group for role, i in instances
            if (group := scheduling.pod_group(rendered.sources[role], role, i))]
    out += [stateful_set(ctx, role, i, rendered) for role, i in instances]
    if proxy_on:
        out.append(proxy.deployment(ctx, admin_token(boundary, ctx)))
    out.append(network_policy(ctx, boundary))
    if proxy_on:
        out.append(proxy_network_policy(ctx, boundary))
    out += [disruption_budget(rendered.sources[role], role) for role in ROLES]
    out += autoscalers(ctx)
    # Plain JSON data with no sub-object shared between manifests or fields, so a caller that
    # patches one object (the controller adds owner references) cannot change another.
    return [json.loads(json.dumps(m)) for m in out]
