"""Findings: what the validator says about a deployment, one record per problem.

Every check in the project (KV compatibility, ports, names, schema) reports through this one type,
so the CLI, the admission webhook and the controller print the same words. The catalog below is
the single list of codes; the table in docs/status.md is generated from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    path: str
    """Manifest field path the finding is about, e.g. `spec.decode.tensorParallelSize`."""
    group: str
    """Cache group or layer name, or '' when the finding is not about one."""
    message: str
    """What is wrong and what to change, as sentences."""

    def __post_init__(self) -> None:
        if self.code not in CATALOG:
            raise ValueError(f"finding code {self.code!r} is not in the catalog")

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        where = (f" at {self.path}" if self.path else "") + (f" [{self.group}]" if self.group else "")
        return f"{self.severity}: {self.code}{where}: {self.message}"


def errors(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


def is_compatible(findings: Iterable[Finding]) -> bool:
    return not errors(findings)


# code -> (severity, what it means, what to do). Severity here is the default the checks use.
CATALOG: dict[str, tuple[Severity, str, str]] = {
    "InvalidSpec": (
        "error", "The manifest does not match the PDDeployment schema.",
        "Fix the named field; `kubectl explain pdd.spec` documents every field."),
    "UnknownModel": (
        "error", "The model is neither a built-in preset nor a readable config or description.",
        "Use a preset from `pdctl models`, an HF config.json, or an explicit `kv` description."),
    "ConfigMapNotFound": (
        "error", "spec.model.hfConfigMap names a ConfigMap or key that does not exist.",
        "Create the ConfigMap with the model's config.json under the named key."),
    "KVCheckDeferred": (
        "warning", "The model config lives in a ConfigMap the admission check cannot read.",
        "Nothing to do: the controller reads it and reports the result in KVCompatible."),
    "UnsupportedArchitecture": (
        "error", "The Hugging Face config's architecture has no KV description rule.",
        "Give an explicit `spec.model.kv` description of the cache groups."),
    "HeadsNotDivisibleByTP": (
        "error", "A sharded cache's head count cannot be split evenly over the tensor parallel size.",
        "Choose a tensorParallelSize that divides the head count (or is a multiple of it for kv heads)."),
    "BlockSizeNotKernelAligned": (
        "error", "A side's engine block size is not a multiple of the backend kernel block.",
        "Pick a blockSize that is a multiple of the kernel block (128 on Ascend)."),
    "BlockNotDivisibleByCompressRatio": (
        "error", "The logical block size is not divisible by a compressed indexer's ratio.",
        "Pick a blockSize that is a multiple of the compress ratio."),
    "SegmentSplitsCompressedEntry": (
        "error", "The gcd of the two block sizes cannot carry whole compressed indexer entries.",
        "Align the two block sizes so their gcd is a multiple of the compress ratio, "
        "for example by overriding blockSize on one side."),
    "CrossTPBlockSizesUnsupported": (
        "error", "MooncakeConnectorV1 maps unequal blocks at kernel granularity, but one side's block is not "
        "a multiple of the other side's kernel block.",
        "Use the same kernelBlockSize on both roles."),
    "KVCacheDTypeUnsupported": (
        "error", "The platform does not accept this KV cache dtype (plain vLLM has no int8).",
        "Use a kvCacheDtype the platform lists (int8 only on vllm-ascend)."),
    "KVCacheDTypeIncompatible": (
        "error", "A 16-bit KV cache dtype that differs from the model dtype; vLLM refuses it at start-up.",
        "Set kvCacheDtype to auto or to the model dtype."),
    "AscendBlockRuleDiffers": (
        "info", "vllm-ascend's block rule gives this side another engine block than plain vLLM's would "
        "(a requested block, or an int8/fp8 KV cache on a pooled-indexer model).",
        "Nothing to do: the operator plans and renders vllm-ascend's block."),
    "RequestedBlockLowered": (
        "warning", "vllm-ascend's C8 rule gives a smaller engine block than the requested blockSize (it caps "
        "the block at the one covering the state page).",
        "Drop blockSize, or expect the smaller block: the operator plans and renders it."),
    "C8LatentNotTileAligned": (
        "error", "vllm-ascend packs an int8/fp8 MLA cache in 128-value tiles and the latent is not a "
        "multiple of 128.",
        "Use kvCacheDtype auto for this model."),
    "ShardedTPIncompatible": (
        "error", "A sharded cache needs one side's TP to divide the other's.",
        "Choose tensor parallel sizes where one divides the other (for example 8 and 4)."),
    "DecodePipelineParallel": (
        "error", "Decode does not support pipeline parallel > 1 with the Mooncake connector.",
        "Set the decode pipeline parallel size to 1; use tensor or data parallel instead."),
    "ModelMismatch": (
        "error", "Prefill and decode serve different models.",
        "Serve the same model on both roles."),
    "DTypeMismatch": (
        "error", "Prefill and decode use different model dtypes.",
        "Use the same dtype on both roles."),
    "KVCacheDTypeMismatch": (
        "error", "Prefill and decode store the KV cache in different dtypes.",
        "Use the same kvCacheDtype on both roles."),
    "StateShapeMismatch": (
        "error", "The per-request state tensors differ in shape between the roles.",
        "Use the same numSpeculativeTokens on both roles (it lengthens the conv state)."),
    "PrefixCachingModeMismatch": (
        "error", "Prefix caching differs between the roles of a hybrid model, so their state caches run in "
        "different vLLM modes, and MooncakeConnectorV1 with speculative tokens cannot find the state block.",
        "Set enablePrefixCaching the same on both roles, or use MooncakeConnectorV2."),
    "PrefixCachingNeedsChunkedPrefill": (
        "error", "Prefix caching on a hybrid model needs chunked prefill (vLLM asserts it at start-up), and "
        "extraArgs turn chunked prefill off.",
        "Remove --no-enable-chunked-prefill from extraArgs, or set enablePrefixCaching to false."),
    "CrossTPSegments": (
        "info", "The two sides' engine block sizes differ; replicated caches move as token runs.",
        "Nothing to do: MooncakeConnectorV2 in the serving image moves the runs."),
    "SmallTransferRuns": (
        "warning", "The mean byte run of the transfer is small, which slows Mooncake transfers.",
        "Make the block sizes equal or multiples of each other so runs merge into larger ones."),
    "PreflightConfigInvalid": (
        "error", "The serving pod's rendered preflight config is missing or unreadable.",
        "Let the operator render the pod; do not replace its command or the mounted config."),
    "PreflightShapeMismatch": (
        "error", "The vllm serve flags or the pod's NPUs disagree with the rendered pairing.",
        "Remove flags that override the rendered parallel sizes, block size or kv-transfer-config."),
    "PreflightImageMismatch": (
        "error", "The pod's installed vllm-ascend lacks what the spec claims of the image (a connector, "
        "the seed change's cross-TP runs, a model family).",
        "Use the image the spec describes, or correct spec.image (vllmAscendVersion, seedChange)."),
    "PreflightPortBusy": (
        "error", "A port the serving pod must bind is already in use.",
        "Stop whatever holds the port, or move the port in the spec."),
    "ImageUnknown": (
        "error", "The serving image's vllm-ascend release cannot be told from its tag or is not one the "
        "operator knows.",
        "Use a quay.io/ascend/vllm-ascend release tag, or set spec.image.vllmAscendVersion "
        "(and seedChange)."),
    "ImageVersionConflict": (
        "error", "spec.image.name is a vllm-ascend release tag (`vllm-ascend:v<version>`) and "
        "spec.image.vllmAscendVersion names another release.",
        "Drop vllmAscendVersion (the tag names the release) or correct the image name."),
    "ImageLacksConnector": (
        "error", "The image's vllm-ascend does not register the kv connector the spec asks for.",
        "Use a connector the image registers or an image whose vllm-ascend registers it."),
    "ImageLacksModel": (
        "error", "The image's vllm-ascend has no model code for the model's family.",
        "Use an image with a vllm-ascend release that supports the model."),
    "ImageLacksSeedChange": (
        "error", "The pairing needs token runs between unequal kernel blocks, which only the seed change "
        "(vllm-ascend PR #16755) provides.",
        "Use an image built from images/vllm-ascend (seedChange: true) or equal kernelBlockSize."),
    "ImageBlockRuleUnmodelled": (
        "error", "The image's vllm-ascend sizes this model's engine block by a rule the operator does not "
        "plan (an older hybrid-model rule, or no C8 packing of an int8/fp8 MLA cache).",
        "Use an image with the vllm-ascend release whose block rule the operator plans (0.30.0rc2)."),
    "ImageCannotRun": (
        "error", "A rendered container's command needs what its image lacks (by the image model, "
        "serving_image/contents.py): for example pd-proxy in a vllm-ascend release image.",
        "Leave spec.proxy.image unset (the operator image runs the proxy) or name an image that has the "
        "command."),
    "PortOverlap": (
        "error", "Two port ranges of the same pod overlap.",
        "Move kvTransfer.kvPort (or the named port) so the ranges are disjoint."),
    "PortInAscendDirectRange": (
        "error", "A port falls in the range the AscendDirect transport listens on.",
        "Raise kvTransfer.kvPort above 20000 + 1000 x NPUs per node (28000 for 8 NPUs)."),
    "PortInHandshakeRange": (
        "error", "A port falls in Mooncake's random P2P handshake RPC range (15000-17000).",
        "Move the port outside 15000-17000."),
    "PortOutOfRange": (
        "error", "A port range runs past 65535.",
        "Lower kvTransfer.kvPort."),
    "DuplicateEngineId": (
        "error", "Two instances would publish the same KV engine id.",
        "Shorten the PDDeployment name so instance names stay distinct."),
    "InvalidName": (
        "error", "metadata.name cannot start the names of the Services the operator creates.",
        "Rename the PDDeployment: lowercase letters, digits and '-', starting with a letter."),
    "NameTooLong": (
        "error", "A generated child name would exceed the Kubernetes limit.",
        "Shorten metadata.name."),
    "EnvOverride": (
        "error", "User env sets a variable the operator owns.",
        "Remove the variable from env; set it through the named spec field instead."),
    "ArgOverride": (
        "error", "Extra engine args repeat a flag the operator renders.",
        "Remove the flag from extraArgs; set it through the named spec field instead."),
    "NodeTooSmall": (
        "error", "An instance's ranks do not divide evenly into nodes.",
        "Make tensorParallelSize x dataParallelSize fit one node or a whole number of nodes."),
    "AutoscalingMetricRole": (
        "error", "An autoscaling target names a vLLM metric of the other role.",
        "Scale prefill on vllm:num_requests_waiting or vllm:time_to_first_token_seconds, decode on "
        "vllm:kv_cache_usage_perc or vllm:num_requests_running."),
    "AutoscalingMetricRepeated": (
        "error", "Two autoscaling targets of one role name the same metric.",
        "Keep one target per metric."),
    "AutoscalingTargetUnreachable": (
        "error", "An autoscaling target lies above what the metric can reach, so the HPA would never "
        "add an instance.",
        "Lower the target below the metric's maximum (1 for vllm:kv_cache_usage_perc)."),
    "AutoscalingBounds": (
        "error", "The autoscaling bounds cannot hold: minReplicas above maxReplicas, or a role that "
        "starts with no instances (an HPA does not scale a target at 0).",
        "Make minReplicas <= maxReplicas and start the role with at least one instance."),
    "ScalingBounds": (
        "error", "The spec.scaling bounds cannot all hold: a minReplicas above its maxReplicas, "
        "minPrefillPerDecode above maxPrefillPerDecode, or role minimums that break the ratio.",
        "Make each minimum at most its maximum and the two minReplicas a pair the ratio admits."),
    "HostPathNotNormalised": (
        "error", "A host path the pods would mount is not a normalised absolute path ('..', '.', '//', a "
        "trailing '/' or blanks).",
        "Write the path in its plain form, e.g. /data/models."),
    "HostPathProtected": (
        "error", "A host path the pods would mount is /, or is, lies inside or contains a directory of the "
        "node's credentials and runtimes (/var/lib/kubelet, /etc/kubernetes, /var/run, /proc, /root, ...; "
        "spec/host_paths.py PROTECTED). No allow-list can permit it.",
        "Mount a directory that holds only what the pods need, such as the weights directory."),
    "HostPathNotAllowed": (
        "error", "A host path the pods would mount is outside the cluster admin's allow-list (the chart's "
        "hostPaths values; by default the Ascend driver and tool paths of the A2/A3/A5 presets and /data).",
        "Use an allowed path, or ask the admin to add it (hostPaths.additional)."),
    "HostNetwork": (
        "warning", "The pods use the host network (the cluster admin allows it), so the NetworkPolicy does "
        "not isolate them.",
        "Only use hostNetwork for RDMA setups that need it."),
    "PrefixRoutingUnusable": (
        "error", "Precise prefix routing (spec.proxy.routing.prefix) needs the proxy and prefill engines "
        "that cache prefixes: the proxy reads the blocks those engines report in their KV events.",
        "Enable the proxy and spec.prefill.enablePrefixCaching, or choose approximate or off."),
    "ProxyWithoutApiKey": (
        "warning", "The proxy serves without an API key: every pod its NetworkPolicy admits (the namespace "
        "and spec.proxy.allowFrom) may send requests.",
        "Set spec.proxy.apiKey to a Secret key holding the key clients must send."),
    "HostNetworkNotAllowed": (
        "error", "The pods would use the host network, which the cluster admin has not allowed: they would "
        "see the node's pod traffic and reach other tenants' ports on it (spec/node_access.py).",
        "Remove hostNetwork, or ask the admin to start the operator with --allow-host-network "
        "(chart value nodeAccess.hostNetwork)."),
    "TolerationNotAllowed": (
        "error", "A toleration would let the pods onto control-plane nodes (a control-plane taint, or no key "
        "with operator Exists), which the cluster admin has not allowed.",
        "Tolerate only the NPU nodes' taints, or ask the admin for --allow-control-plane-tolerations "
        "(chart value nodeAccess.controlPlaneTolerations)."),
    "HostPathCreationNotAllowed": (
        "error", "A host mount of type DirectoryOrCreate, FileOrCreate or \"\" would create its path on the "
        "node, owned by root, which the cluster admin has not allowed.",
        "Use type File or Directory, or ask the admin for --allow-host-path-creation (chart value "
        "nodeAccess.hostPathCreation)."),
}
