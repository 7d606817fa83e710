"""The security settings of every pod the operator renders: the engine pods and the proxy's.

- No API token: no container of either pod talks to the Kubernetes API (the proxy and the KV-link
  gate read mounted ConfigMaps), so the namespace's default ServiceAccount token is not mounted. A
  pod rendered with a serviceAccountName of its own keeps it: it was given one to use the API.
- Seccomp `RuntimeDefault` on both pods (the Pod Security "restricted" profile asks for it; nothing
  here makes unusual syscalls).
- Capabilities: every container drops ALL, the engine container (`vllm`) included. Its NPUs come
  from the device plugin as device nodes and device cgroup rules (MindCluster's Ascend Docker
  Runtime and Device Plugin, gitcode.com/Ascend/mind-cluster component/ascend-docker-runtime
  README @ branch_v26.0.0: it mounts /dev/davinciX, /dev/davinci_manager, /dev/devmm_svm and
  configures the device cgroup), not from capabilities, and MindCluster's hardening guide
  ("Controlling Docker Usage Permissions", hiascend.com mindcluster 2610 toolboxug_0128) names only
  the NPU Exporter, a monitoring component, as needing root and privileged mode. Without
  capabilities a root engine cannot chown, kill other users' processes or use raw sockets (no
  NET_RAW: no sniffing). Mooncake over RDMA would need IPC_LOCK (its Kubernetes guide), which the
  operator does not render. Not yet run on an NPU node: docs/security.md says what was verified where.
- The engine pods' user: the image's (root in the vllm-ascend images) unless spec.image.runAs
  names a non-root one, which then runs every container of the pod (runAsNonRoot). Either way the
  pod has the nodes' HwHiAiUser group (spec.image.driverGroup) as a supplemental group: the driver's
  device nodes belong to it, and a root without CAP_DAC_OVERRIDE opens them only through it.
- The proxy and the tools init container run from the operator image as its non-root user (NON_ROOT)
  on a read-only root file system: the proxy needs no file of its own to write, the init container
  writes only the bundle's emptyDir.
"""

from __future__ import annotations

from pd_operator.api.types import ImageSpec

NON_ROOT = 10001
"""The uid and gid of the operator image's user (images/operator/Dockerfile USER; the chart's
securityContext), which runs the proxy and the tools init container: numeric, so the kubelet can
enforce runAsNonRoot whatever user the image names."""

NO_ESCALATION = {"privileged": False, "allowPrivilegeEscalation": False}
SIDECAR = {**NO_ESCALATION, "capabilities": {"drop": ["ALL"]}}
"""No privileged mode, no setuid path to more capabilities (allowPrivilegeEscalation defaults to
true when unset), no capabilities: every container of an engine pod but the tools init container."""
ENGINE = SIDECAR
"""The engine container, as the containers beside it (the KV-link probe, the image report)."""
PROXY = {**SIDECAR, "runAsNonRoot": True, "readOnlyRootFilesystem": True}
TOOLS = {**PROXY, "runAsUser": NON_ROOT, "runAsGroup": NON_ROOT}
"""The tools init container of an engine pod, whose pod-level context sets no user."""


def pod_fields(pod_spec: dict, *, non_root: bool = False, image: ImageSpec | None = None) -> dict:
    """The pod-level fields for `pod_spec` (which must already name its serviceAccountName, if any):
    `non_root` runs it as the operator image's user; `image`, a serving pod's, adds the driver's group
    and runs it as spec.image.runAs when set."""
    context: dict = {"seccompProfile": {"type": "RuntimeDefault"}}
    if non_root:
        context = {"runAsNonRoot": True, "runAsUser": NON_ROOT, "runAsGroup": NON_ROOT, **context}
    elif image is not None:
        user = image.run_as
        context = {**({"runAsNonRoot": True, "runAsUser": user.uid, "runAsGroup": user.gid} if user else {}),
                   "supplementalGroups": [image.driver_group], **context}
    token = {} if "serviceAccountName" in pod_spec else {"automountServiceAccountToken": False}
    return {**token, "securityContext": context}
