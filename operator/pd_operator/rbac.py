"""The Kubernetes permissions the operator needs, as data: the single source for the chart's RBAC.

Every rule here must be used by a call in `pd_operator.controller.client` and every call there
must be covered by a rule (a test checks both directions). `make chart-sync` writes these rules
into the chart; never edit the chart's copy by hand.
"""

from __future__ import annotations

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
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", *CHILD_VERBS]},
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
