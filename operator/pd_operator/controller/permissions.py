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
# from kopf's in-memory indexes instead of listing them), and patch the PDDeployments' annotations
# (its progress and last-handled configuration). Login, peering and the webhook configuration are
# the chart's.
WATCHED: list[tuple[str, str]] = [(GROUP, PLURAL), *CHILDREN, ("", "pods")]
FRAMEWORK: set[Need] = {
    *((verb, group, plural) for group, plural in WATCHED for verb in ("list", "watch")),
    ("patch", GROUP, PLURAL),
}

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
# create too), listed by label, watched by kopf for changes and pruned by label (DELETE). No `get`:
# nothing reads a single child (ConfigMaps aside: the model's config.json).
CHILD_VERBS = ["list", "watch", "create", "patch", "delete"]

RULES: list[dict] = [
    # kopf lists, watches and annotates them; the reconcile reads one fresh before acting.
    {"apiGroups": ["pd.serving.dev"], "resources": ["pddeployments"],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["pd.serving.dev"], "resources": ["pddeployments/status"], "verbs": ["patch"]},
    # The roles' PDRoles are children (applied, created with their replicas, pruned); the operator
    # writes their status for the scale subresource.
    {"apiGroups": ["pd.serving.dev"], "resources": ["pdroles"], "verbs": CHILD_VERBS},
    {"apiGroups": ["pd.serving.dev"], "resources": ["pdroles/status"], "verbs": ["patch"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets", "deployments"], "verbs": CHILD_VERBS},
    {"apiGroups": [""], "resources": ["services"], "verbs": CHILD_VERBS},
    # The proxy's Role grants get/list/watch on its membership ConfigMap: RBAC lets the operator
    # create it (and bind it) because it holds those verbs itself (render/proxy_access.py).
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", *CHILD_VERBS]},
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": CHILD_VERBS},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"],
     "verbs": CHILD_VERBS},
    # Pods are only read for status and deleted for group restarts; the workloads create them.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "delete"]},
    # The last line of a decode pod's kv-link gate: the figures of a KV link that changed state.
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": CHILD_VERBS},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": CHILD_VERBS},
    # One PodGroup per instance with spec.scheduling.gang: kube-scheduler's or Volcano's.
    {"apiGroups": ["scheduling.k8s.io", "scheduling.volcano.sh"], "resources": ["podgroups"],
     "verbs": CHILD_VERBS},
    {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": CHILD_VERBS},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]

# Only with the self-signed webhook: the operator writes its URL and CA into the configuration the
# chart created (controller/webhook.py). The chart limits these to that one object (resourceNames).
WEBHOOK_RULES: list[dict] = [
    {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
     "verbs": ["patch"]},
]
