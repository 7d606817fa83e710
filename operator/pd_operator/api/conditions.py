"""The conditions of a PDDeployment and a PDRole, every reason each can have, and the reasons of the
events the operator posts: one home, as the API's own, so the status code, the PDRoles, the events
and the tables in docs/status.md (tools/docs.py) agree. Code names a type or reason only through
these constants (tests/controller/test_reasons.py).

Conditions follow the Kubernetes API conventions: CamelCase reasons, a message a user can act on.
"""

from __future__ import annotations

# -- condition types -----------------------------------------------------------------------------------
KV_COMPATIBLE = "KVCompatible"
PREFILL_READY = "PrefillReady"
DECODE_READY = "DecodeReady"
ROLE_READY = {"prefill": PREFILL_READY, "decode": DECODE_READY}
PROXY_READY = "ProxyReady"
READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
GANG_SCHEDULING = "GangScheduling"
SCALING_LIMITED = "ScalingLimited"
TOOLS_CURRENT = "ToolsCurrent"
TYPES = (KV_COMPATIBLE, PREFILL_READY, DECODE_READY, PROXY_READY, READY, PROGRESSING, DEGRADED,
         GANG_SCHEDULING, SCALING_LIMITED, TOOLS_CURRENT)

# -- condition reasons ---------------------------------------------------------------------------------
COMPATIBLE = "Compatible"
LAYOUT_UNRESOLVED = "Unknown"
INSTANCES_READY = "InstancesReady"
SCALED_TO_ZERO = "ScaledToZero"
INSTANCES_NOT_READY = "InstancesNotReady"
UNSCHEDULABLE = "Unschedulable"
KV_LINK_NOT_READY = "KVLinkNotReady"
PROXY_AVAILABLE = "ProxyAvailable"
PROXY_DISABLED = "Disabled"
NO_UPSTREAMS = "NoUpstreams"
PROXY_NOT_READY = "ProxyNotReady"
SERVING = "Serving"
ROLLOUT_IN_PROGRESS = "RolloutInProgress"
ROLLOUT_PAUSED = "RolloutPaused"
ROLLOUT_BLOCKED = "RolloutBlocked"
ROLLOUT_PARTITIONED = "RolloutPartitioned"
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
SURGE_UNSCHEDULABLE = "SurgeUnschedulable"
WAITING_FOR_PODS = "WaitingForPods"
COMPLETE = "Complete"
INVALID_SPEC = "InvalidSpec"
"""Also the finding code of a manifest that does not match the schema (findings.py)."""
GROUP_RESTART = "GroupRestart"
GROUP_RESTART_LIMITED = "GroupRestartLimited"
NAME_CONFLICT = "NameConflict"
FOREIGN_CHILD = "ForeignChild"
AS_EXPECTED = "AsExpected"
POD_GROUPS = "PodGroups"
SINGLE_POD_INSTANCES = "SinglePodInstances"
PARTIAL_PLACEMENT_POSSIBLE = "PartialPlacementPossible"
GANG_UNAVAILABLE = "GangUnavailable"
WITHIN_BOUNDS = "WithinBounds"
# Why a role runs another count than its PDRole asks for (spec/scaling.py: Hold.bound).
MIN_REPLICAS = "MinReplicas"
MAX_REPLICAS = "MaxReplicas"
OPERATOR_TOOLS = "OperatorTools"
OLDER_TOOLS = "OlderTools"
MIN_RATIO = "MinPrefillPerDecode"
MAX_RATIO = "MaxPrefillPerDecode"

FINDING = "<finding code>"
"""Stands for a finding code (see the findings catalog) in REASONS."""
COPIED = "<reason of the first failing condition>"
"""Stands for the reason Ready copies in REASONS."""

_ROLE_REASONS = [
    ("True", INSTANCES_READY, "Every instance of the role has all its pods Ready, on one KV layout."),
    ("True", SCALED_TO_ZERO, "The role runs no instances (its PDRole asks for none)."),
    ("False", INSTANCES_NOT_READY, "Some instances are starting or loading the model; see their pods."),
    ("False", UNSCHEDULABLE, "The scheduler cannot place a pod of the role; the message is the "
     "scheduler's (no node with that many NPUs free, a weights PVC that does not exist, ...)."),
]
REASONS: list[tuple[str, str, str, str]] = [
    (KV_COMPATIBLE, "True", COMPATIBLE, "Prefill and decode KV layouts pair; the message gives both "
     "engine block sizes and the segment size."),
    (KV_COMPATIBLE, "False", FINDING, "The KV check failed; the message names the field to change. "
     "Children of the last valid spec keep running, gated, drained and scaled on that spec."),
    (KV_COMPATIBLE, "False", LAYOUT_UNRESOLVED, "The model's KV description or a role's KV layout could "
     "not be resolved, without a finding saying why."),
    *((ROLE_READY[role], status, reason, text) for role in ("prefill", "decode")
      for status, reason, text in _ROLE_REASONS),
    (DECODE_READY, "False", KV_LINK_NOT_READY, "Some decode instances have not (or no longer) pulled and "
     "verified the test KV of every prefill instance, so the proxy does not route to them; "
     "status.kvLinks names the pairs and the probe's error."),
    (PROXY_READY, "True", PROXY_AVAILABLE, "The routing proxy's pods are ready."),
    (PROXY_READY, "True", PROXY_DISABLED, "spec.proxy.enabled is false."),
    (PROXY_READY, "False", NO_UPSTREAMS, "The proxy's membership lacks a role: no instance it may route "
     "to (none yet, no decode instance with a working KV link, or none on the new KV layout during a "
     "rollout). Its pods stay up, not Ready, and answer 503."),
    (PROXY_READY, "False", PROXY_NOT_READY, "The proxy's pods are not ready yet."),
    (READY, "True", SERVING, "Prefill, decode (and the proxy when used) are ready."),
    (READY, "False", COPIED, "Copied from the first condition above that is not True (or GangUnavailable), "
     "or a finding code when the spec is invalid."),
    (PROGRESSING, "True", ROLLOUT_IN_PROGRESS, "A new pod template rolls through the instances "
     "(spec.<role>.rollout): each leaves the proxy, drains, is replaced and re-joins once Ready; the "
     "message counts the instances updated. The proxy pairs prefill and decode of one KV layout only."),
    (PROGRESSING, "Unknown", ROLLOUT_PAUSED, "spec.<role>.rollout.paused is true: no further instance "
     "moves. Set it to false to continue."),
    (PROGRESSING, "False", ROLLOUT_BLOCKED, "No outdated instance can move while each role keeps "
     "replicas - maxUnavailable serving (a KV-layout change with a role of few instances, or a partition "
     "that leaves new instances no partner of their layout); the message says what to change."),
    (PROGRESSING, "False", PROGRESS_DEADLINE_EXCEEDED, "No instance was replaced, drained or became Ready "
     "within spec.<role>.rollout.progressDeadlineSeconds (the clock stops while paused or blocked): the "
     "rollout stopped and the others keep serving. Nothing rolls back by itself: fix the template, or "
     "apply the previous spec again (which moves back only what moved); any spec change resumes."),
    (PROGRESSING, "False", SURGE_UNSCHEDULABLE, "A surge instance (spec.<role>.rollout.maxSurge) cannot be "
     "scheduled (no node with free NPUs, say) and no outdated instance may leave before one serves in its "
     "place: free NPUs, or set maxSurge 0 and maxUnavailable 1 to replace instances in place (a role of one "
     "instance then serves nothing while it is replaced). The message has the scheduler's reason."),
    (PROGRESSING, "False", ROLLOUT_PARTITIONED, "Every instance at or above spec.<role>.rollout.partition "
     "runs the current template and is Ready; those below it stay on an older one (a canary): lower the "
     "partition to move them."),
    (PROGRESSING, "True", WAITING_FOR_PODS, "Children are applied; pods are not all ready yet."),
    (PROGRESSING, "False", COMPLETE, "Every child is up to date and ready."),
    (PROGRESSING, "False", INVALID_SPEC, "The spec is invalid; fix it to continue."),
    (DEGRADED, "True", GROUP_RESTART, "A rank of a multi-pod instance failed, so all its pods were "
     "restarted together."),
    (DEGRADED, "True", GROUP_RESTART_LIMITED, "An instance keeps failing; group restarts stopped at the "
     "limit (3 per 10 minutes). Fix the cause, then delete its pods."),
    (DEGRADED, "True", NAME_CONFLICT, "An object the operator would create exists without this "
     "PDDeployment as owner; delete or rename it."),
    (DEGRADED, "True", FOREIGN_CHILD, "An object carries this PDDeployment's labels but is not owned by "
     "it; it is left alone."),
    (DEGRADED, "False", AS_EXPECTED, "Nothing is degraded."),
    (TOOLS_CURRENT, "True", OPERATOR_TOOLS, "Every instance runs the tools (pd-preflight, the KV-link "
     "probe) of the operator's own image (`--tools-image`)."),
    (TOOLS_CURRENT, "False", OLDER_TOOLS, "Instances run the tools of an older operator image, which an "
     "operator upgrade keeps so that it restarts no engine (status.<role>.instances[].tools names them): "
     "they take the new tools with their role's next template change, or at once with "
     "spec.image.toolsUpdate: WithOperator."),
    (GANG_SCHEDULING, "True", POD_GROUPS, "Each instance is one PodGroup of all its pods "
     "(spec.scheduling.gang): the scheduler binds all of an instance's pods or none."),
    (GANG_SCHEDULING, "True", SINGLE_POD_INSTANCES,
     "Every instance is one pod: none can be placed in part."),
    (GANG_SCHEDULING, "False", PARTIAL_PLACEMENT_POSSIBLE, "Instances of several pods are scheduled pod by "
     "pod (spec.scheduling.gang none): one can hold NPUs while its other pods wait. Set gang to volcano "
     "or kubernetes."),
    (GANG_SCHEDULING, "False", GANG_UNAVAILABLE, "The cluster does not serve the PodGroup kind the spec "
     "asks for (or drops its topology constraint); the message says what to enable. The instances' "
     "StatefulSets are not applied until it does."),
    (SCALING_LIMITED, "True", MAX_REPLICAS, "A role's PDRole asks for more instances than "
     "spec.scaling.<role>.maxReplicas: the role runs that many. Raise the bound to run more."),
    (SCALING_LIMITED, "True", MIN_REPLICAS, "A role's PDRole asks for fewer instances than "
     "spec.scaling.<role>.minReplicas: the role runs that many. Lower the bound to run fewer."),
    (SCALING_LIMITED, "True", MAX_RATIO, "Prefill asks for more instances than "
     "spec.scaling.ratio.maxPrefillPerDecode allows with the decode instances running: prefill runs the "
     "most it allows. Raise the ratio or scale decode up first."),
    (SCALING_LIMITED, "True", MIN_RATIO, "Decode asks for more instances than "
     "spec.scaling.ratio.minPrefillPerDecode allows with the prefill instances running: decode runs the "
     "most it allows. Lower the ratio or scale prefill up first."),
    (SCALING_LIMITED, "False", WITHIN_BOUNDS, "Each role runs the instances its PDRole asks for."),
]
"""Every condition with the reasons it can have, for docs/status.md (tools/docs.py)."""

# -- event reasons -------------------------------------------------------------------------------------
# Besides these, a significant condition change posts an event under the condition's reason
# (controller/events.py).
INSTANCE_REPLACED = "InstanceReplaced"
DRAINED = "Drained"
DRAIN_TIMED_OUT = "DrainTimedOut"

EVENTS: list[tuple[str, str, str]] = [
    ("Normal", INSTANCE_REPLACED, "A rollout deleted the pods of an instance that left the proxy and "
     "drained (or whose drain bound passed); its StatefulSet recreates them from the new template. The "
     "message names the old and new revisions."),
    ("Normal", DRAINED, "An instance a scale-down removed left the proxy, nothing needed it any more, "
     "and it was deleted."),
    ("Warning", DRAIN_TIMED_OUT, "An instance a scale-down removed was deleted when its drain bound "
     "passed, while requests may still have needed it (spec.scaling.drain.decodeSeconds, "
     "spec.kvTransfer.timeouts.abortRequestSeconds)."),
]
"""Every event the operator posts on a PDDeployment besides ON_TRANSITION's, for docs/status.md
(tools/docs.py)."""
ON_TRANSITION = ("Normal or Warning", "<reason of the condition>", "KVCompatible, Ready or Degraded changed, "
                 "or Progressing stopped (RolloutBlocked, ProgressDeadlineExceeded); Warning when the news "
                 "is bad. A new PDDeployment whose pods are still starting posts no Ready event.")
"""The events of condition changes (controller/events.py transitions): the docs table's last row."""

CONDITION_REASONS = frozenset(reason for _, _, reason, _ in REASONS) - {FINDING, COPIED}
EVENT_REASONS = frozenset(reason for _, reason, _ in EVENTS)
"""With CONDITION_REASONS, every reason the operator may write besides a finding code."""
