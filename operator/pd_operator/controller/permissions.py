"""The Kubernetes permissions the operator needs, as data: the single source for the chart's RBAC,
and the `@needs` declarations of the API client's methods that they must cover.

Every rule here must be used by a call in `pd_operator.controller.client` and every call there
must be covered by a rule: tests/controller/test_rbac.py compares all declarations (plus FRAMEWORK,
what kopf does on the operator's behalf) with RULES in both directions. `make chart-sync` writes
these rules into the chart; never edit the chart's copy by hand.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from pd_operator.api.types import GROUP, PLURAL
from pd_operator.render.kinds import CHILDREN

Need = tuple[str, str, str]
"""(verb, API group, resource)."""

# What kopf does on the operator's behalf with its own API client: list and watch the PDDeployments,
# their children and pods (the handlers react to them, and the reconcile reads children and pods
# from kopf's in-memory indexes instead of listing them). It writes nothing: its handlers are event
# handlers, which keep no state on the objects (controller/handlers.py). Login, peering and the
# webhook configuration are the chart's.
WATCHED: list[tuple[str, str]] = [(GROUP, PLURAL), *CHILDREN, ("", "pods")]
FRAMEWORK: set[Need] = {(verb, group, plural) for group, plural in WATCHED for verb in ("list", "watch")}

DECLARED: dict[str, set[Need]] = {}
"""Method name -> the requests it declared."""
_current: contextvars.ContextVar[set[Need] | None] = contextvars.ContextVar("needs", default=None)

P = ParamSpec("P")
R = TypeVar("R")


def needs(*requests: Need) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Declare the requests a method makes; the client refuses any other (current_needs)."""
    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        DECLARED[fn.__name__] = set(requests)

        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            token = _current.set(set(requests))
            try:
                return fn(*args, **kwargs)
            finally:
                _current.reset(token)
        return inner
    return wrap


def current_needs() -> set[Need]:
    """What the method running now declared (nothing outside a declared method)."""
    return _current.get() or set()


def children_needs(*verbs: str) -> list[Need]:
    return [(verb, group, plural) for verb in verbs for group, plural in CHILDREN]

# Children are applied with server-side apply (PATCH, which creates a missing object and so needs
# create too), listed by label, watched by kopf for changes and pruned by label (DELETE). `get`: before
# the first apply of a child the operator does not see among its own, it reads that name, and leaves
# an object it finds there alone unless this PDDeployment owns it (never adopt:
# controller/reconcile.py).
CHILD_VERBS = ["get", "list", "watch", "create", "patch", "delete"]

CHILD = "Children (applied, listed and watched by label, pruned; get: a name before its first apply)"


def _rule(why: str, groups: list[str], resources: list[str], verbs: list[str]) -> tuple[str, dict]:
    return why, {"apiGroups": groups, "resources": resources, "verbs": verbs}


JUSTIFIED: list[tuple[str, dict]] = [
    _rule("kopf lists and watches PDDeployments; the reconcile reads one fresh before acting",
          ["pd.serving.dev"], ["pddeployments"], ["get", "list", "watch"]),
    _rule("The status the reconcile computes", ["pd.serving.dev"], ["pddeployments/status"], ["patch"]),
    _rule(f"{CHILD}: the roles' PDRoles, created with their replicas", ["pd.serving.dev"], ["pdroles"],
          CHILD_VERBS),
    _rule("PDRole status, which their scale subresource reads", ["pd.serving.dev"], ["pdroles/status"],
          ["patch"]),
    _rule(f"{CHILD}: an instance's StatefulSet and its revision records (ControllerRevisions), the "
          "proxy's Deployment", ["apps"], ["statefulsets", "controllerrevisions", "deployments"],
          CHILD_VERBS),
    _rule(f"{CHILD}: the proxy's and the instances' Services", [""], ["services"], CHILD_VERBS),
    _rule(f"{CHILD}: the serving and membership ConfigMaps; get, list and watch also let the operator "
          "create the proxy's Role granting them on its one ConfigMap (RBAC escalation check; "
          "render/proxy_access.py), and get reads a model's config.json", [""], ["configmaps"], CHILD_VERBS),
    _rule(f"{CHILD}: the proxy's ServiceAccount", [""], ["serviceaccounts"], CHILD_VERBS),
    _rule(f"{CHILD}: the proxy's Role and RoleBinding on its membership ConfigMap",
          ["rbac.authorization.k8s.io"], ["roles", "rolebindings"], CHILD_VERBS),
    _rule("Pods are read for status and deleted for group restarts and rollouts; the workloads create "
          "them", [""], ["pods"], ["list", "watch", "delete"]),
    _rule(f"{CHILD}: the KV ports' NetworkPolicy", ["networking.k8s.io"], ["networkpolicies"], CHILD_VERBS),
    _rule(f"{CHILD}: a PodDisruptionBudget per role", ["policy"], ["poddisruptionbudgets"], CHILD_VERBS),
    _rule(f"{CHILD}: a PodGroup per instance with spec.scheduling.gang, kube-scheduler's or Volcano's",
          ["scheduling.k8s.io", "scheduling.volcano.sh"], ["podgroups"], CHILD_VERBS),
    _rule(f"{CHILD}: an HPA per autoscaled role", ["autoscaling"], ["horizontalpodautoscalers"], CHILD_VERBS),
    _rule("Events on significant condition changes", [""], ["events"], ["create"]),
]
"""Every rule with why the operator needs it: the chart's files/rbac-rules.yaml carries each reason
as a comment above its rule (tools/chart_sync.py)."""
RULES: list[dict] = [rule for _, rule in JUSTIFIED]


def why(rule: dict) -> str | None:
    """The reason for `rule` or for the rule it was split from (same groups, a subset of resources)."""
    return next((reason for reason, source in JUSTIFIED if source["apiGroups"] == rule["apiGroups"]
                 and set(rule["resources"]) <= set(source["resources"])), None)

# Only with the self-signed webhook (controller/webhook.py). The chart limits these to that one object
# (resourceNames).
WEBHOOK_REASON = ("Only with the self-signed webhook: the operator writes its URL and CA into its own "
                  "webhook configuration (the chart limits the rule to that object by name)")
WEBHOOK_RULES: list[dict] = [
    {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
     "verbs": ["patch"]},
]
