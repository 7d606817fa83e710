"""The conditions of a PDDeployment and a PDRole, with every reason each can have: one home, as the
API's own, so the status code, the PDRoles and the table in docs/status.md (tools/docs.py) agree.

Conditions follow the Kubernetes API conventions: CamelCase reasons, a message a user can act on.
"""

from __future__ import annotations

SCALING_LIMITED = "ScalingLimited"
WITHIN_BOUNDS = "WithinBounds"
# Why a role runs another count than its PDRole asks for (spec/scaling.py: Hold.bound).
MIN_REPLICAS = "MinReplicas"
MAX_REPLICAS = "MaxReplicas"
MIN_RATIO = "MinPrefillPerDecode"
MAX_RATIO = "MaxPrefillPerDecode"

TYPES = ("KVCompatible", "PrefillReady", "DecodeReady", "ProxyReady", "Ready",
         "Progressing", "Degraded", "GangScheduling", "ScalingLimited")
FINDING = "<finding code>"
"""Stands for a finding code (see the findings catalog) in REASONS."""

_ROLE_REASONS = [
    ("True", "InstancesReady", "Every instance of the role has all its pods Ready, on one KV layout."),
    ("True", "ScaledToZero", "The role runs no instances (its PDRole asks for none)."),
    ("False", "InstancesNotReady", "Some instances are starting or loading the model; see their pods."),
    ("False", "Unschedulable", "The scheduler cannot place a pod of the role; the message is the "
     "scheduler's (no node with that many NPUs free, a weights PVC that does not exist, ...)."),
]
REASONS: list[tuple[str, str, str, str]] = [
    ("KVCompatible", "True", "Compatible", "Prefill and decode KV layouts pair; the message gives both "
     "engine block sizes and the segment size."),
    ("KVCompatible", "False", FINDING, "The KV check failed; the message names the field to change. "
     "Children of the last valid spec keep running."),
    *((f"{role}Ready", status, reason, text) for role in ("Prefill", "Decode")
      for status, reason, text in _ROLE_REASONS),
    ("DecodeReady", "False", "KVLinkNotReady", "Some decode instances have not (or no longer) pulled and "
     "verified the test KV of every prefill instance, so the proxy does not route to them; "
     "status.kvLinks names the pairs and the probe's error."),
    ("ProxyReady", "True", "ProxyAvailable", "The routing proxy's pods are ready."),
    ("ProxyReady", "True", "Disabled", "spec.proxy.enabled is false."),
    ("ProxyReady", "False", "NoUpstreams", "The proxy's membership lacks a role: no instance it may route "
     "to (none yet, no decode instance with a working KV link, or none on the new KV layout during a "
     "rollout). Its pods stay up, not Ready, and answer 503."),
    ("ProxyReady", "False", "ProxyNotReady", "The proxy's pods are not ready yet."),
    ("Ready", "True", "Serving", "Prefill, decode (and the proxy when used) are ready."),
    ("Ready", "False", "<reason of the first failing condition>", "Copied from the first condition above "
     "that is not True (or GangUnavailable), or a finding code when the spec is invalid."),
    ("Progressing", "True", "RolloutInProgress", "A new pod template rolls through the instances "
     "(spec.<role>.rollout): each leaves the proxy, drains, is replaced and re-joins once Ready; the "
     "message counts the instances updated. The proxy pairs prefill and decode of one KV layout only."),
    ("Progressing", "Unknown", "RolloutPaused", "spec.<role>.rollout.paused is true: no further instance "
     "moves. Set it to false to continue."),
    ("Progressing", "False", "RolloutBlocked", "No outdated instance can move while each role keeps "
     "replicas - maxUnavailable serving (a KV-layout change with a role of few instances, or a partition "
     "that leaves new instances no partner of their layout); the message says what to change."),
    ("Progressing", "False", "ProgressDeadlineExceeded", "No instance was replaced or became Ready on the "
     "new template within spec.<role>.rollout.progressDeadlineSeconds: the rollout stopped and the others "
     "keep serving. Fix the template; applying the previous spec again rolls back only what moved."),
    ("Progressing", "True", "WaitingForPods", "Children are applied; pods are not all ready yet."),
    ("Progressing", "False", "Complete", "Every child is up to date and ready."),
    ("Progressing", "False", "InvalidSpec", "The spec is invalid; fix it to continue."),
    ("Degraded", "True", "GroupRestart", "A rank of a multi-pod instance failed, so all its pods were "
     "restarted together."),
    ("Degraded", "True", "GroupRestartLimited", "An instance keeps failing; group restarts stopped at the "
     "limit (3 per 10 minutes). Fix the cause, then delete its pods."),
    ("Degraded", "True", "NameConflict", "An object the operator would create exists without this "
     "PDDeployment as owner; delete or rename it."),
    ("Degraded", "True", "ForeignChild", "An object carries this PDDeployment's labels but is not owned by "
     "it; it is left alone."),
    ("Degraded", "False", "AsExpected", "Nothing is degraded."),
    ("GangScheduling", "True", "PodGroups", "Each instance is one PodGroup of all its pods "
     "(spec.scheduling.gang): the scheduler binds all of an instance's pods or none."),
    ("GangScheduling", "True", "SinglePodInstances",
     "Every instance is one pod: none can be placed in part."),
    ("GangScheduling", "False", "PartialPlacementPossible", "Instances of several pods are scheduled pod by "
     "pod (spec.scheduling.gang none): one can hold NPUs while its other pods wait. Set gang to volcano "
     "or kubernetes."),
    ("GangScheduling", "False", "GangUnavailable", "The cluster does not serve the PodGroup kind the spec "
     "asks for (or drops its topology constraint); the message says what to enable. The instances' "
     "StatefulSets are not applied until it does."),
    ("ScalingLimited", "True", MAX_REPLICAS, "A role's PDRole asks for more instances than "
     "spec.scaling.<role>.maxReplicas: the role runs that many. Raise the bound to run more."),
    ("ScalingLimited", "True", MIN_REPLICAS, "A role's PDRole asks for fewer instances than "
     "spec.scaling.<role>.minReplicas: the role runs that many. Lower the bound to run fewer."),
    ("ScalingLimited", "True", MAX_RATIO, "Prefill asks for more instances than "
     "spec.scaling.ratio.maxPrefillPerDecode allows with the decode instances running: prefill runs the "
     "most it allows. Raise the ratio or scale decode up first."),
    ("ScalingLimited", "True", MIN_RATIO, "Decode asks for more instances than "
     "spec.scaling.ratio.minPrefillPerDecode allows with the prefill instances running: decode runs the "
     "most it allows. Lower the ratio or scale prefill up first."),
    (SCALING_LIMITED, "False", WITHIN_BOUNDS, "Each role runs the instances its PDRole asks for."),
]
"""Every condition with the reasons it can have, for docs/status.md (tools/docs.py)."""
