"""The kinds the renderer produces, and the resource (plural) each is served as.

One table for everyone who must know them: the API client (paths), the handlers (what kopf watches),
the permissions (what RBAC grants) and the tests.
"""

from __future__ import annotations

from pd_operator.api.types import API_VERSION, ROLE_KIND, ROLE_PLURAL

# (apiVersion, kind) -> resource (plural).
CHILD_KINDS: dict[tuple[str, str], str] = {
    # The roles' scale targets (render/pdroles.py, controller/pdroles.py).
    (API_VERSION, ROLE_KIND): ROLE_PLURAL,
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    # The proxy's API identity (render/proxy_access.py).
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("apps/v1", "Deployment"): "deployments",
    # An instance's revision records (controller/revisions.py).
    ("apps/v1", "ControllerRevision"): "controllerrevisions",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    # Gang scheduling (render/scheduling.py): only with spec.scheduling.gang, and only served where
    # kube-apiserver enables scheduling.k8s.io/v1alpha2 or Volcano's CRD is installed.
    ("scheduling.k8s.io/v1alpha2", "PodGroup"): "podgroups",
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): "podgroups",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "horizontalpodautoscalers",
}


def api_group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def api_version_only(api_version: str) -> str:
    return api_version.rpartition("/")[2]


CHILD_RESOURCES: list[tuple[str, str, str]] = [(api_group(av), api_version_only(av), plural)
                                               for (av, _), plural in CHILD_KINDS.items()]
"""(group, version, plural) of every child kind: what kopf watches and indexes."""
CHILDREN: list[tuple[str, str]] = [(group, plural) for group, _, plural in CHILD_RESOURCES]


def resource_of(obj: dict) -> str:
    try:
        return CHILD_KINDS[(obj["apiVersion"], obj["kind"])]
    except KeyError:
        raise ValueError(f"{obj['apiVersion']} {obj['kind']} is not a kind the operator manages") from None
