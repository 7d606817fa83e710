"""The proxy pods' API identity: a ServiceAccount, a Role allowing get, list and watch on the one
membership ConfigMap (resourceNames), and the RoleBinding between them.

Why: pd-proxy watches its membership ConfigMap (proxy/watch.py) so that a change reaches it as the
API server sends it, not a minute later through the kubelet's projection of the mounted file. It
lists and watches by the field selector `metadata.name=<name>`, which the API server authorises
against resourceNames (kubernetes/kubernetes: staging/src/k8s.io/apiserver/pkg/endpoints/request/
requestinfo.go @ v1.36.3; tests/proxy/test_watch.py runs it against kube-apiserver v1.36.3): a proxy
pod can read its own membership and nothing else, not even another ConfigMap of its namespace.

The operator may create this Role because it holds get, list and watch on ConfigMaps itself (RBAC
refuses a Role granting more than its creator holds unless the creator has `escalate`), and the
RoleBinding because it holds what the Role grants (else it would need `bind`): no escalate or bind
verb in controller/permissions.py.
"""

from __future__ import annotations

from pd_operator.render.labels import metadata
from pd_operator.render.proxy import COMPONENT
from pd_operator.spec.validate import Resolved

RBAC = "rbac.authorization.k8s.io"
MEMBERSHIP_VERBS = ["get", "list", "watch"]


def service_account(ctx: Resolved) -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": metadata(ctx, ctx.names.proxy_access, COMPONENT)}


def role(ctx: Resolved) -> dict:
    return {"apiVersion": f"{RBAC}/v1", "kind": "Role",
            "metadata": metadata(ctx, ctx.names.proxy_access, COMPONENT),
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                       "resourceNames": [ctx.names.proxy_membership], "verbs": MEMBERSHIP_VERBS}]}


def role_binding(ctx: Resolved) -> dict:
    name = ctx.names.proxy_access
    return {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
            "metadata": metadata(ctx, name, COMPONENT),
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.deployment.namespace}]}


def proxy_access(ctx: Resolved) -> list[dict]:
    """The ServiceAccount, the Role and the RoleBinding, in apply order."""
    return [service_account(ctx), role(ctx), role_binding(ctx)]
