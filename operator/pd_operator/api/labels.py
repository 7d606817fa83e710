"""Every label and annotation key the operator writes or selects on: one home, as the API's own.

`app.kubernetes.io/*` are the recommended labels; `pd.serving.dev/*` are what selectors use and what
the operator remembers on objects between reconciles.
"""

from __future__ import annotations

from pd_operator.api.types import GROUP

# -- labels --------------------------------------------------------------------------------------------
NAME = "pd-serving"
"""app.kubernetes.io/name of everything rendered."""
MANAGER = "pd-operator"
"""app.kubernetes.io/managed-by and part-of."""
# The recommended labels (kubernetes/website: content/en/docs/concepts/overview/working-with-objects/
# common-labels.md); APP_ where the bare name is taken by one of ours.
APP_NAME = "app.kubernetes.io/name"
APP_INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
PART_OF = "app.kubernetes.io/part-of"
MANAGED_BY = "app.kubernetes.io/managed-by"
DEPLOYMENT = f"{GROUP}/deployment"
"""The owning PDDeployment's name, on every child and pod (the operator selects by it)."""
ROLE = f"{GROUP}/role"
"""prefill, decode or proxy."""
INSTANCE = f"{GROUP}/instance"
"""The instance's ordinal within its role."""
KV_LAYOUT = f"{GROUP}/kv-layout"
"""The kv-layout hash of a serving pod (spec/layout.py): prefill and decode pair only when equal."""
REVISION = f"{GROUP}/revision"
"""A serving pod's template revision (render/workloads.py): the rollout replaces instances whose pods
carry another than their role's current one (controller/rollout.py). Not the StatefulSet's own
CONTROLLER_REVISION_HASH."""
RECORDED_REVISION = f"{GROUP}/recorded-revision"
"""On an instance's revision record (a ControllerRevision, controller/revisions.py): the role's template
revision it records. Only the operator's records carry it: the StatefulSet controller's own
ControllerRevisions copy the pod template's labels (our DEPLOYMENT among them), never this one, so the
operator watches and keeps only its own."""
# The pod's ordinal in its StatefulSet, set by the StatefulSet controller (GA in 1.32;
# k8s.io/api: apps/v1/types.go PodIndexLabel @ v0.36.3): 0 is an instance's leader.
POD_INDEX = "apps.kubernetes.io/pod-index"
# Set by the workload controllers on the pods they create, never by the operator: a policy that
# selects them asks for pods a controller made from a template, not any pod with our labels
# (k8s.io/api: apps/v1/types.go DefaultDeploymentUniqueLabelKey, ControllerRevisionHashLabelKey @ v0.36.3).
# CONTROLLER_REVISION_HASH names the StatefulSet revision a pod was made from (controller/restarts.py).
POD_TEMPLATE_HASH = "pod-template-hash"
CONTROLLER_REVISION_HASH = "controller-revision-hash"
# The label the API server sets on every namespace: its name (k8s.io/api: core/v1/well_known_labels.go
# LabelMetadataName @ v0.36.3).
NAMESPACE_NAME = "kubernetes.io/metadata.name"
# The well-known node label, one value per node (k8s.io/api: core/v1/well_known_labels.go
# LabelHostname @ v0.36.3).
HOSTNAME = "kubernetes.io/hostname"
# The taints (and labels) of control-plane nodes: kubeadm's (kubernetes/kubernetes:
# cmd/kubeadm/app/constants/constants.go LabelNodeRoleControlPlane @ v1.36.3) and the older master one
# some distributions still set. spec/node_access.py refuses tolerating them unless the admin allows it.
CONTROL_PLANE_TAINTS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")

# -- annotations ---------------------------------------------------------------------------------------
APPLIED_HASH = f"{GROUP}/applied-hash"
"""On every applied child: the hash of the manifest applied (controller/diff.py)."""
FORWARDED_REPLICAS = f"{GROUP}/forwarded-replicas"
"""On a PDRole: the spec.<role>.replicas of the PDDeployment the operator last forwarded to it."""
GROUP_RESTARTS = f"{GROUP}/group-restarts"
"""On an instance's StatefulSet: when its pods were last restarted together (controller/restarts.py)."""
GROUP_RESTART_DELETED = f"{GROUP}/group-restart-deleted"
"""On an instance's StatefulSet: the pod uids a group restart deleted."""
FINALIZER = f"{GROUP}/finalizer"
# The pod annotation naming a pod's Volcano PodGroup (volcano.sh/apis: pkg/apis/scheduling/v1beta1/
# labels.go KubeGroupNameAnnotationKey @ v1.13.0).
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
