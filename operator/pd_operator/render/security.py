"""The security settings of every pod the operator renders: the engine pods and the proxy's.

- No API token: no container of either pod talks to the Kubernetes API (the proxy and the KV-link
  gate read mounted ConfigMaps), so the namespace's default ServiceAccount token is not mounted. A
  pod rendered with a serviceAccountName of its own keeps it: it was given one to use the API.
- Seccomp `RuntimeDefault` on both pods (the Pod Security "restricted" profile asks for it; nothing
  here makes unusual syscalls).
- Capabilities: every container drops ALL except the engine container (`vllm`), which keeps the
  runtime's default set. Its NPUs come from the device plugin as device nodes and cgroup rules, not
  from capabilities, and no Ascend document we could find lists the capabilities CANN and HCCL need
  inside a container: the Ascend images run as root, and MindCluster's hardening guide
  ("Controlling Docker Usage Permissions", hiascend.com mindcluster 2610 toolboxug_0128) recommends a
  non-root user but names components that need root. So the engine drops nothing until that is
  measured on an NPU node; it never adds any and never escalates. Mooncake over RDMA would need
  IPC_LOCK (its Kubernetes guide), which the operator does not render.
- The proxy and the tools init container run from the operator image as its non-root user (NON_ROOT)
  on a read-only root file system: the proxy needs no file of its own to write, the init container
  writes only the bundle's emptyDir.
"""

from __future__ import annotations

NON_ROOT = 10001
"""The uid and gid of the operator image's user (images/operator/Dockerfile USER; the chart's
securityContext), which runs the proxy and the tools init container: numeric, so the kubelet can
enforce runAsNonRoot whatever user the image names."""

NO_ESCALATION = {"privileged": False, "allowPrivilegeEscalation": False}
ENGINE = NO_ESCALATION
"""The engine container: no privileged mode, no setuid path to more capabilities
(allowPrivilegeEscalation defaults to true when unset)."""
SIDECAR = {**NO_ESCALATION, "capabilities": {"drop": ["ALL"]}}
"""Containers beside the engine (the KV-link probe)."""
PROXY = {**SIDECAR, "runAsNonRoot": True, "readOnlyRootFilesystem": True}
TOOLS = {**PROXY, "runAsUser": NON_ROOT, "runAsGroup": NON_ROOT}
"""The tools init container of an engine pod, whose pod-level context sets no user."""


def pod_fields(pod_spec: dict, *, non_root: bool = False) -> dict:
    """The pod-level fields for `pod_spec` (which must already name its serviceAccountName, if any)."""
    context: dict = {"seccompProfile": {"type": "RuntimeDefault"}}
    if non_root:
        context = {"runAsNonRoot": True, "runAsUser": NON_ROOT, "runAsGroup": NON_ROOT, **context}
    token = {} if "serviceAccountName" in pod_spec else {"automountServiceAccountToken": False}
    return {**token, "securityContext": context}
