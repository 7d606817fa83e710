"""The Kubernetes permissions the operator needs, as data: the single source for the chart's RBAC.

Every rule here must be used by a call in `pd_operator.controller.client` and every call there
must be covered by a rule (a test checks both directions). `make chart-sync` writes these rules
into the chart; never edit the chart's copy by hand.
"""

from __future__ import annotations

READ = ("get", "list", "watch")
# Children are applied with server-side apply (PATCH) and pruned by label (DELETE).
MANAGE = (*READ, "create", "patch", "delete")

RULES: list[dict] = [
    {"apiGroups": ["pd.serving.dev"], "resources": ["pddeployments"], "verbs": [*READ, "patch"]},
    {"apiGroups": ["pd.serving.dev"], "resources": ["pddeployments/status"], "verbs": ["get", "patch"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets", "deployments"], "verbs": list(MANAGE)},
    {"apiGroups": [""], "resources": ["services", "configmaps"], "verbs": list(MANAGE)},
    # Pods are only read for status and deleted for group restarts; workloads create them.
    {"apiGroups": [""], "resources": ["pods"], "verbs": [*READ, "delete"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": list(MANAGE)},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": list(MANAGE)},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
]
