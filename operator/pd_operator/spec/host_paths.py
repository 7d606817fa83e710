"""Which node paths a PDDeployment may mount as hostPath volumes.

Why here and not in Pod Security: NPU namespaces must allow hostPath for the Ascend driver mounts,
so namespace Pod Security cannot stop `spec.model.weights.hostPath.path: /` or a host mount of
/etc/kubernetes/pki, and whoever may create a PDDeployment would read the node's credentials. The
validator (pdctl, the admission webhook and the controller alike) refuses such a path with a
finding naming the field, by two rules:

- Never (PROTECTED, not configurable): `/`, a path that is not normalised (`..`, `.`, `//`, a
  trailing `/` or blank), and a path that is one of PROTECTED, lies inside one, or contains one (a
  parent such as /etc or /var would expose /etc/kubernetes or /var/lib/kubelet).
- Only what the cluster admin allows (HostPathPolicy, the chart's `hostPaths` values passed as
  `pd-operator run --allow-host-path`): a path must be an allowed entry or lie under one. The
  default allows the driver and tool paths of the node-generation presets (GENERATION_MOUNTS) and
  WEIGHTS_ROOT for weights. An entry may name the PDDeployment's namespace as `{namespace}`
  (NAMESPACE): with `/data/{namespace}`, a PDDeployment of namespace team-a may mount
  /data/team-a/models and nothing of /data/team-b, so teams sharing nodes cannot read each other's
  weights (a namespace is a DNS label: no '/' or '..' can come in with it).

The check is on the path as written: a symlink on the node is followed by the kubelet, so an
allowed directory must not be writable by the users who create PDDeployments.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass

from pd_operator.api.types import ROLES, HostMountsSpec, PDDeployment
from pd_operator.findings import Finding

# Host files the Ascend runtime needs inside the container, by node generation, with the device
# plugin handing out the NPUs themselves (vllm-ascend: docs/source/installation.md and the
# multi-node PD tutorials' `docker run` mounts @ 0.30.0rc2): (path, hostPath type). A path of type
# File or Directory that is missing on the node keeps the pod from starting, so each generation
# lists only what its nodes have: A2 (910B) keeps npu-smi in /usr/local/sbin and has
# /etc/hccn.conf; A3 keeps it in /usr/local/bin; A5 (950) has no hccn.conf but
# /etc/hccl_rootinfo.json and /etc/hixlep/. The driver directory is on every generation; the DCMI
# library directory is only mounted where present (DirectoryOrCreate leaves an empty directory).
DRIVER = ("/usr/local/Ascend/driver", "Directory")
DCMI = ("/usr/local/dcmi", "DirectoryOrCreate")
INSTALL_INFO = ("/etc/ascend_install.info", "File")
GENERATION_MOUNTS: dict[str, tuple[tuple[str, str], ...]] = {
    "A2": (DRIVER, DCMI, INSTALL_INFO, ("/usr/local/sbin/npu-smi", "File"), ("/etc/hccn.conf", "File")),
    "A3": (DRIVER, DCMI, INSTALL_INFO, ("/usr/local/bin/npu-smi", "File")),
    "A5": (DRIVER, DCMI, INSTALL_INFO, ("/usr/local/bin/npu-smi", "File"),
           ("/etc/hccl_rootinfo.json", "File"), ("/etc/hixlep", "Directory")),
    "none": (),
}

WEIGHTS_ROOT = "/data"
"""The default directory for hostPath weights (the examples keep them under /data/models).
vllm-ascend's tutorials mount /root/.cache, which PROTECTED refuses (root's home holds
.kube/config and SSH keys); a shared file system such as /mnt/sfs_turbo is added by the admin."""

PROTECTED = (
    "/proc", "/sys", "/dev", "/boot",  # kernel and device interfaces
    "/root",  # root's home: kubeconfigs, SSH keys
    "/run", "/var/run",  # container runtime sockets (containerd.sock gives the node)
    "/var/lib/kubelet",  # pod volumes and service account tokens of every pod on the node
    "/etc/kubernetes",  # kubelet credentials, API server and etcd PKI, static pod manifests
    "/var/lib/etcd",  # the cluster's state
    "/var/lib/containerd", "/var/lib/docker", "/var/lib/containers",  # every container's files
    "/etc/shadow", "/etc/sudoers", "/etc/ssh",  # the node's own credentials
)
"""Directories (and files) no PDDeployment may mount, nor anything inside or above them."""


def _within(path: str, root: str) -> bool:
    """`path` is `root` or lies under it (by whole components)."""
    return path == root or path.startswith(root + "/")


def refusal(path: str) -> tuple[str, str] | None:
    """(finding code, why) when `path` may never be mounted: not normalised, `/`, or touching
    PROTECTED. None otherwise."""
    if path == "/":
        return "HostPathProtected", "/ is the node's whole file system"
    parts = path.split("/")[1:]
    if not path.startswith("/") or any(p in ("", ".", "..") for p in parts) or path != path.strip() \
            or any(ord(c) < 32 or ord(c) == 127 for c in path):
        plain = posixpath.normpath("/" + path.strip()).replace("//", "/")
        hint = f": write it as {plain}" if plain != "/" else ""
        return ("HostPathNotNormalised", f"{path!r} is not a normalised absolute path (no '..', '.', "
                f"'//', trailing '/', blanks or control characters){hint}")
    for protected in PROTECTED:
        if path == protected:
            subject = path
        elif _within(path, protected):
            subject = f"{path} lies inside {protected}, which"
        elif _within(protected, path):
            subject = f"{path} contains {protected}, which"
        else:
            continue
        return ("HostPathProtected", f"{subject} holds the node's credentials or runtime state: no "
                "PDDeployment may mount it, whatever the admin's allow-list says; mount a directory that "
                "holds only what the pods need")
    return None


NAMESPACE = "{namespace}"
"""Stands for the PDDeployment's namespace in an allow-list entry."""


def default_allowed() -> tuple[str, ...]:
    """Every path of the generation presets, and WEIGHTS_ROOT."""
    paths = {path for mounts in GENERATION_MOUNTS.values() for path, _ in mounts}
    return (*sorted(paths), WEIGHTS_ROOT)


@dataclass(frozen=True)
class HostPathPolicy:
    """The cluster admin's allow-list: a host path is allowed when it is an entry or lies under one,
    and refusal() has nothing against it."""

    allowed: tuple[str, ...]

    def __post_init__(self) -> None:
        # Checked as a namespace would fill it in ("ns" stands for any DNS label).
        bad = [refused[1] for p in self.allowed if (refused := refusal(p.replace(NAMESPACE, "ns")))]
        bad += [f"{p} has braces other than {NAMESPACE}" for p in self.allowed
                if "{" in p.replace(NAMESPACE, "") or "}" in p.replace(NAMESPACE, "")]
        if bad:
            raise ValueError("host path allow-list entries that can never be allowed: " + "; ".join(bad))

    @classmethod
    def of(cls, paths: Iterable[str]) -> HostPathPolicy:
        """The policy of the given entries; none given: the default. ValueError on an entry that
        refusal() refuses (an admin's typo must not widen or silently narrow it)."""
        given = tuple(dict.fromkeys(paths))
        return cls(given) if given else DEFAULT

    def allowed_in(self, namespace: str) -> tuple[str, ...]:
        """The entries with `{namespace}` filled in."""
        return tuple(root.replace(NAMESPACE, namespace) for root in self.allowed)

    def allows(self, path: str, namespace: str) -> bool:
        return any(_within(path, root) for root in self.allowed_in(namespace))


DEFAULT = HostPathPolicy(default_allowed())


def mounts(spec: HostMountsSpec) -> list[tuple[str, str]]:
    """(path, type) of every host mount: the generation's, with explicit paths replacing or adding."""
    out = dict(GENERATION_MOUNTS[spec.generation])
    out |= {m.path: m.type for m in spec.paths}
    return list(out.items())


def _checked(policy: HostPathPolicy, path: str, field: str, namespace: str) -> list[Finding]:
    refused = refusal(path)
    if refused is not None:
        code, why = refused
        return [Finding(code, "error", field, "", f"{why[:1].upper()}{why[1:]}.")]
    if not policy.allows(path, namespace):
        return [Finding("HostPathNotAllowed", "error", field, "",
                        f"{path} is outside the host paths the cluster admin allows in namespace {namespace} "
                        f"({', '.join(policy.allowed_in(namespace))}); use one of them, or ask the admin to "
                        "add it (the pd-operator chart's hostPaths.additional).")]
    return []


def findings(dep: PDDeployment, policy: HostPathPolicy = DEFAULT) -> list[Finding]:
    """A finding per host path the pods would mount that is refused, at the field that names it:
    the weights' hostPath, each explicit host mount, or the generation for a preset's mount."""
    out = []
    weights = dep.spec.model.weights.host_path
    if weights is not None:
        out += _checked(policy, weights.path, "spec.model.weights.hostPath.path", dep.namespace)
    for role in ROLES:
        host = dep.role(role).host_mounts
        explicit = {m.path for m in host.paths}
        for path, _ in GENERATION_MOUNTS[host.generation]:
            if path not in explicit:
                out += _checked(policy, path, f"spec.{role}.hostMounts.generation", dep.namespace)
        for i, m in enumerate(host.paths):
            out += _checked(policy, m.path, f"spec.{role}.hostMounts.paths[{i}].path", dep.namespace)
    return out
