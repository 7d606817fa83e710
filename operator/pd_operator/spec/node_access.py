"""What a PDDeployment may take of the nodes beyond its own pods: the cluster admin's decision.

Whoever may create a PDDeployment in a namespace must not reach beyond it. Each of these reaches a
node itself, and so every tenant with a pod on it, and none is stopped by namespace Pod Security in
an NPU namespace (which must allow hostPath for the driver, spec/host_paths.py):

- `hostNetwork` (spec.<role>.hostNetwork): the pods share the node's network namespace, so they
  see its plaintext pod traffic (prompts, the proxy's bearer key), reach co-located tenants'
  engines and Mooncake ports (a NetworkPolicy always admits a pod's own node) and bind its ports.
  The spec has no hostPort field (unknown fields are refused), so this is the only way to a host
  port.
- A toleration of the control plane's taints (node-role.kubernetes.io/control-plane, .../master)
  or a tolerate-everything one (no key, operator Exists): with a nodeSelector, the pods run beside
  the API server and etcd.
- A host mount that creates what is missing on the node (`DirectoryOrCreate`, `FileOrCreate`, and
  `""`, which leaves it to the runtime: Docker and containerd's CRI create a missing directory):
  a root-owned entry in an allowed directory, such as an empty /etc/hccl_rootinfo.json or a
  squatted model directory of another team. The node-generation presets' own mounts are the
  operator's choice and exempt.

Each is refused by the one validator (pdctl, the admission webhook, the controller) with a finding
at the field path that names the `pd-operator run` flag (the chart's `nodeAccess` values) that
allows it. Separately, `always_pull_images` makes every container pull its image (imagePullPolicy
Always): with IfNotPresent or Never, a pod runs another tenant's private image that a node cached,
without that image's pull secret.
"""

from __future__ import annotations

from dataclasses import dataclass

from pd_operator.api.labels import CONTROL_PLANE_TAINTS
from pd_operator.api.types import ROLES, PDDeployment
from pd_operator.findings import Finding

CREATING_TYPES = ("DirectoryOrCreate", "FileOrCreate", "")

HOST_NETWORK_FLAG = "--allow-host-network"
TOLERATIONS_FLAG = "--allow-control-plane-tolerations"
HOST_PATH_CREATION_FLAG = "--allow-host-path-creation"
ALWAYS_PULL_FLAG = "--always-pull-images"
CHART_VALUES = {HOST_NETWORK_FLAG: "nodeAccess.hostNetwork",
                TOLERATIONS_FLAG: "nodeAccess.controlPlaneTolerations",
                HOST_PATH_CREATION_FLAG: "nodeAccess.hostPathCreation",
                ALWAYS_PULL_FLAG: "alwaysPullImages"}
"""The chart value that sets each flag."""


@dataclass(frozen=True)
class NodeAccess:
    """The cluster admin's allowances (`pd-operator run` flags, the chart's values); the default
    allows none."""

    host_network: bool = False
    control_plane_tolerations: bool = False
    host_path_creation: bool = False
    always_pull_images: bool = False
    """Not an allowance: every rendered container then pulls its image."""

    def pull_policy(self, asked: str) -> str:
        return "Always" if self.always_pull_images else asked


DEFAULT = NodeAccess()


def _ask_admin(flag: str) -> str:
    return (f"ask the cluster admin to start the operator with {flag} (the pd-operator chart's "
            f"{CHART_VALUES[flag]}: true) if this namespace needs it")


def reaches_control_plane(toleration: object) -> str | None:
    """Why `toleration` lets a pod onto control-plane nodes, or None."""
    if not isinstance(toleration, dict):
        return None
    key = toleration.get("key") or ""
    if not key and toleration.get("operator") == "Exists":
        return "a toleration without a key and with operator Exists tolerates every taint"
    if key in CONTROL_PLANE_TAINTS:
        return f"a toleration of {key} lets the pods onto the cluster's control-plane nodes"
    return None


def findings(dep: PDDeployment, access: NodeAccess = DEFAULT) -> list[Finding]:
    """An error finding at each field that asks for node access the admin did not allow; a warning
    for the host network the admin did allow (the NetworkPolicy cannot isolate such pods)."""
    out = []
    for role in ROLES:
        spec = dep.role(role)
        if spec.host_network and not access.host_network:
            out.append(Finding("HostNetworkNotAllowed", "error", f"spec.{role}.hostNetwork", "",
                               f"{role} pods on the host network would see the node's pod traffic and reach "
                               f"other tenants' ports on it; remove hostNetwork, or "
                               f"{_ask_admin(HOST_NETWORK_FLAG)}."))
        elif spec.host_network:
            out.append(Finding("HostNetwork", "warning", f"spec.{role}.hostNetwork", "",
                               f"{role} pods use the host network, so the NetworkPolicy cannot keep other "
                               "pods away from their KV ports; use it only for RDMA setups that need it."))
        if not access.control_plane_tolerations:
            for i, toleration in enumerate(spec.tolerations):
                if why := reaches_control_plane(toleration):
                    out.append(Finding("TolerationNotAllowed", "error", f"spec.{role}.tolerations[{i}]", "",
                                       f"{why[:1].upper()}{why[1:]}; tolerate only the NPU nodes' own "
                                       "taints (such as huawei.com/ascend-1980), or "
                                       f"{_ask_admin(TOLERATIONS_FLAG)}."))
        if not access.host_path_creation:
            for i, mount in enumerate(spec.host_mounts.paths):
                if mount.type in CREATING_TYPES:
                    shown = mount.type or ('"" (which leaves a missing path to the runtime: it creates a '
                                           'directory)')
                    out.append(Finding("HostPathCreationNotAllowed", "error",
                                       f"spec.{role}.hostMounts.paths[{i}].type", "",
                                       f"Type {shown} creates {mount.path} on the node when it is missing, "
                                       "owned by root; use File or Directory (the kubelet then starts "
                                       "the pod only where it exists), or "
                                       f"{_ask_admin(HOST_PATH_CREATION_FLAG)}."))
    return out
