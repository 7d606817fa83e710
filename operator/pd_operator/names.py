"""Deterministic names of everything rendered for one PDDeployment, and their length limits.

A StatefulSet's pods carry the label `controller-revision-hash: <name>-<10 chars>`, a label value
of at most 63 characters, so StatefulSet names stay within 52; Service and pod names are DNS
labels (63). The validator checks every name before anything is rendered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DNS_LABEL_MAX = 63
STATEFULSET_MAX = 52
# Every child name starts with the PDDeployment's, and Service names must be RFC 1035 labels
# (k8s.io/kubernetes: pkg/apis/core/validation ValidateServiceName = NameIsDNS1035Label @ v1.36.3):
# lowercase letters, digits and '-', starting with a letter. Stricter than the RFC 1123 subdomain
# the API server asks of the PDDeployment itself, which admits dots and a leading digit.
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class Names:
    deployment: str
    namespace: str

    def instance(self, role: str, index: int) -> str:
        """The StatefulSet and headless Service of one role instance."""
        return f"{self.deployment}-{role}-{index}"

    def pod(self, role: str, index: int, ordinal: int) -> str:
        return f"{self.instance(role, index)}-{ordinal}"

    def pod_host(self, role: str, index: int, ordinal: int) -> str:
        """Stable DNS name of a pod through its instance's headless Service."""
        return f"{self.pod(role, index, ordinal)}.{self.instance(role, index)}.{self.namespace}.svc"

    def pod_group(self, role: str, index: int, suffix: str = "") -> str:
        """The PodGroup that gang-schedules one instance: the instance's name, plus `-<suffix>` (a
        digest of its spec) for kube-scheduler's PodGroups, whose spec is immutable, so that a new
        spec is a new PodGroup. At most 52 + 1 + 8 characters."""
        return f"{self.instance(role, index)}-{suffix}" if suffix else self.instance(role, index)

    def engine_id(self, role: str, index: int) -> str:
        """Unique KV engine id of an instance (vllm-ascend asserts one is set)."""
        return f"{self.namespace}.{self.instance(role, index)}"

    @property
    def proxy(self) -> str:
        return f"{self.deployment}-proxy"

    @property
    def proxy_membership(self) -> str:
        """The ConfigMap the proxy pods mount: the upstreams they route to (pd_operator.proxy.membership)."""
        return f"{self.deployment}-proxy"

    @property
    def proxy_access(self) -> str:
        """The proxy pods' ServiceAccount, and the Role and RoleBinding that let it read the
        membership ConfigMap through the API (render/proxy_access.py)."""
        return f"{self.deployment}-proxy"

    def revision_config(self, role: str, digest: str) -> str:
        """One revision's config of a role (render/serving_config.py): preflight config and the
        KV-link probe's pairing; `digest` is a hash of its data."""
        return f"{self.deployment}-{role}-{digest}"

    def revision_record(self, role: str, index: int, digest: str) -> str:
        """One instance's record of a revision (a ControllerRevision, controller/revisions.py); `digest`
        is a hash of its data. The `-rev-` keeps it apart from the StatefulSet controller's own
        ControllerRevisions, `<StatefulSet>-<hash>` with no dash in the hash."""
        return f"{self.instance(role, index)}-rev-{digest}"

    @property
    def prefill_peers(self) -> str:
        """Without the proxy: the prefill instances the decode gates link (render/serving_config.py)."""
        return f"{self.deployment}-prefill-peers"

    @property
    def last_valid_spec(self) -> str:
        """The operator's record of the last spec it could serve (controller/last_valid.py)."""
        return f"{self.deployment}-last-valid-spec"

    @property
    def network_policy(self) -> str:
        return f"{self.deployment}-kv"

    def role(self, role: str) -> str:
        """The role's PDRole (its scale subresource) and the HPA that scales it."""
        return f"{self.deployment}-{role}"

    def disruption_budget(self, role: str) -> str:
        return self.role(role)

    def limits(self, replicas: dict[str, int], pods_per_instance: dict[str, int]) -> list[tuple[str, int]]:
        """(longest name of each kind, its limit) for the names this deployment renders."""
        out = [(self.proxy, DNS_LABEL_MAX), (self.revision_config("prefill", "0" * 10), DNS_LABEL_MAX),
               (self.network_policy, DNS_LABEL_MAX)]
        for role, count in replicas.items():
            last = max(count - 1, 0)
            out.append((self.instance(role, last), STATEFULSET_MAX))
            out.append((self.pod(role, last, max(pods_per_instance[role] - 1, 0)), DNS_LABEL_MAX))
            out.append((self.disruption_budget(role), DNS_LABEL_MAX))
        return out
