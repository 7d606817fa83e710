"""The PDDeployment and PDRole API (`pd.serving.dev/v1alpha1`), defined once.

These pydantic models are the single source of truth: `make crds` generates the CRD's
openAPIV3Schema from them (field docstrings become `kubectl explain` text), the validator parses
manifests with them, and the renderer reads them. Cross-field rules that CEL can express are
declared here too (`cel(...)`), so the API server enforces them even without the webhook.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import Field, model_validator

from pd_operator.api.serving_metrics import VllmMetric
from pd_operator.api_model import ApiModel, cel, preserve_unknown
from pd_operator.kv.model import DType, ModelKV
from pd_operator.serving_image.capabilities import VERSION_PATTERN as VLLM_ASCEND_VERSION

GROUP = "pd.serving.dev"
VERSION = "v1alpha1"
KIND: Final = "PDDeployment"
PLURAL = "pddeployments"
API_VERSION: Final = "pd.serving.dev/v1alpha1"
ROLE_KIND: Final = "PDRole"
ROLE_PLURAL = "pdroles"

Port = Annotated[int, Field(ge=1024, le=65535)]
DNSLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
Quantity = Annotated[int | str, Field(json_schema_extra={"x-kubernetes-int-or-string": True})]
FreeObject = Annotated[dict[str, Any], Field(json_schema_extra=preserve_unknown())]

ASCEND_NPU = "huawei.com/Ascend910"
DEFAULT_KV_PORT = 36000


def _exactly_one(obj: ApiModel, fields: tuple[str, ...], where: str) -> None:
    given = [f for f in fields if getattr(obj, f) is not None]
    if len(given) != 1:
        aliases = [obj.model_fields[f].alias or f for f in fields]
        raise ValueError(f"{where} needs exactly one of {', '.join(aliases)}; "
                         f"{'none' if not given else ', '.join(given)} given")


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the PDDeployment's namespace."""

    name: DNSLabel
    key: str = Field(default="config.json", min_length=1, max_length=253)


class PVCWeights(ApiModel):
    claim_name: str = Field(min_length=1, max_length=253)
    """PersistentVolumeClaim holding the weights (mounted read-only)."""
    sub_path: str | None = Field(default=None, max_length=1024)


class HostPathWeights(ApiModel):
    path: str = Field(min_length=1, max_length=1024, pattern=r"^/")
    """Directory on every NPU node that holds the weights (mounted read-only). It must be a
    normalised path the cluster admin allows (the operator chart's hostPaths; by default under /data)."""


@cel("[has(self.pvc), has(self.hostPath), has(self.image)].filter(x, x).size() == 1",
     "weights needs exactly one of pvc, hostPath or image")
class WeightsSpec(ApiModel):
    """Where the model weights come from: a PVC, a node directory, or baked into the image."""

    pvc: PVCWeights | None = None
    host_path: HostPathWeights | None = None
    image: bool | None = None
    """True when the serving image already contains the weights at `spec.model.name`."""
    mount_path: str = Field(default="/models", pattern=r"^/", max_length=1024)
    """Where pvc or hostPath weights are mounted in the serving pods."""

    @model_validator(mode="after")
    def _one_source(self) -> WeightsSpec:
        _exactly_one(self, ("pvc", "host_path", "image"), "spec.model.weights")
        return self


@cel("[has(self.preset), has(self.hfConfig), has(self.hfConfigMap), has(self.kv)]"
     ".filter(x, x).size() == 1",
     "model needs exactly one KV description source: preset, hfConfig, hfConfigMap or kv")
class ModelSpec(ApiModel):
    """The model to serve and the description of its KV caches."""

    name: str = Field(min_length=1, max_length=1024)
    """What `vllm serve` loads: a path (under weights.mountPath for pvc/hostPath) or a model id."""
    served_model_name: str | None = Field(default=None, max_length=253)
    """Name clients use in requests; defaults to `name`."""
    preset: str | None = Field(default=None, max_length=63)
    """A built-in KV description (`pdctl models` lists them), for example `glm-5.3-flash`."""
    hf_config: FreeObject | None = None
    """The model's Hugging Face `config.json`, inline."""
    hf_config_map: ConfigMapKeyRef | None = None
    """A ConfigMap key holding the model's `config.json` (read by the controller)."""
    kv: ModelKV | None = None
    """An explicit description of the model's KV cache groups."""
    dtype: DType | None = None
    """Model dtype (`--dtype`); defaults to the KV description's dtype."""
    kv_cache_dtype: str = Field(default="auto",
                                pattern=r"^(auto|bfloat16|float16|fp8|fp8_e4m3|fp8_e5m2|int8)$")
    """KV cache dtype (`--kv-cache-dtype`); `auto` follows the model dtype. `int8` is vllm-ascend's (C8): it
    packs the MLA latent of pooled-indexer models such as GLM-5.3-Flash at 528 bytes per token."""
    weights: WeightsSpec
    max_model_len: int | None = Field(default=None, ge=1, le=10_000_000)
    """`--max-model-len` on both roles."""

    @model_validator(mode="after")
    def _one_description(self) -> ModelSpec:
        _exactly_one(self, ("preset", "hf_config", "hf_config_map", "kv"), "spec.model")
        return self


HWHIAI_ID = 1000
"""The HwHiAiUser the Ascend driver installs as the owner of its device nodes and libraries, uid and
gid 1000 in MindCluster's guides ("Deploying the hwMindX user", hiascend.com ModelZoo rmtes_00006,
which adds a non-root user to that group to use the NPUs)."""


class ImageUser(ApiModel):
    """A non-root user for the serving pods' containers."""

    uid: int = Field(default=HWHIAI_ID, ge=1, le=2_147_483_647)
    gid: int = Field(default=HWHIAI_ID, ge=0, le=2_147_483_647)


WITH_OPERATOR: Final = "WithOperator"
"""spec.image.toolsUpdate: the serving pods take a new operator image's tools at once."""


class ImageSpec(ApiModel):
    """The serving image: a vllm-ascend release (quay.io/ascend/vllm-ascend) or one built from
    images/vllm-ascend. What it can serve (connectors, model runners, cross-TP runs) follows from its
    vllm-ascend release and the seed change; `pdctl validate` refuses pairings it cannot serve."""

    name: str = Field(min_length=1, max_length=512)
    vllm_ascend_version: str | None = Field(default=None, max_length=32, pattern=VLLM_ASCEND_VERSION)
    """The vllm-ascend release the image is built on, e.g. `0.30.0rc2`. Defaults to the release a
    `vllm-ascend:v<version>[-suffix]` tag names; required for other tags."""
    seed_change: bool = False
    """The image's vllm-ascend carries vllm-ascend PR #16755 (Model Runner V2 for GLM-Next, cross-TP
    token runs between unequal kernel blocks), as images built from images/vllm-ascend do. Checked
    against the installed vllm-ascend when the pod starts."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    pull_secrets: list[DNSLabel] = Field(default_factory=list, max_length=16)
    driver_group: int = Field(default=HWHIAI_ID, ge=0, le=2_147_483_647)
    """The gid of the nodes' HwHiAiUser group, which owns the driver's device nodes and libraries: every
    serving pod gets it as a supplemental group, so its containers open the NPUs through that group
    rather than through a capability (they have none)."""
    tools_update: Literal["WithNextChange", "WithOperator"] = "WithNextChange"
    """When the serving pods take the tools (pd-preflight, the KV-link probe) of a newly installed
    operator image: `WithNextChange`, with the role's next pod-template change, so an operator upgrade
    restarts no engine by itself (status.<role>.instances[].tools and the ToolsCurrent condition name
    the instances on older tools); `WithOperator`, at once, through each role's rollout."""
    run_as: ImageUser | None = None
    """Run every container of the serving pods as this non-root user (runAsNonRoot), not as the image's
    user (root in the vllm-ascend images). Not yet run on an NPU node: the image must let that user
    write its home and caches (set HOME through spec.<role>.env if it has none), and the nodes' driver
    must be readable by its group. Unset: the image's user, with every capability dropped."""


class TimeoutSpec(ApiModel):
    abort_request_seconds: int = Field(default=480, ge=1, le=86_400)
    """How long prefill keeps a request's KV for decode to pull (VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT)."""
    transfer_ms: int = Field(default=10_000, ge=100, le=3_600_000)
    """ASCEND_TRANSFER_TIMEOUT, in milliseconds as Mooncake reads it (its default is 3000; vllm-ascend's
    PD guides set 10000)."""
    connect_ms: int = Field(default=10_000, ge=100, le=3_600_000)
    """ASCEND_CONNECT_TIMEOUT, in milliseconds as Mooncake reads it (its default is 3000; vllm-ascend's
    PD guides set 10000)."""


class KVTransferSpec(ApiModel):
    """How KV moves from prefill to decode. vllm-ascend's PD connectors open their Mooncake engine
    with P2P handshakes and the `ascend` transport, so neither is a choice here."""

    connector: Literal["MooncakeConnectorV2", "MooncakeConnectorV1"] = "MooncakeConnectorV2"
    """V2 (pull mode, vllm-ascend 0.28.0rc1 and later) and V1 (push mode) both map unequal engine block
    sizes at kernel-block granularity; V1 splits state only from a larger prefill TP into a smaller
    decode TP. Both run on either model runner."""
    kv_port: Port = DEFAULT_KV_PORT
    """Base port of the connector: worker handshake ports and the scheduler side channel follow it."""
    timeouts: TimeoutSpec = Field(default_factory=TimeoutSpec)
    load_failure_policy: Literal["recompute", "fail"] | None = None
    """What decode does when a KV pull fails (vLLM kv_load_failure_policy)."""


class EnvVar(ApiModel):
    name: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = None
    value_from: FreeObject | None = None


class Resources(ApiModel):
    """Extra container resources; the NPU request is set by the operator from the shape."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)


HostPathType = Literal["", "Directory", "File", "DirectoryOrCreate", "FileOrCreate"]
NodeGeneration = Literal["A2", "A3", "A5", "none"]


class HostPathMount(ApiModel):
    """A file or directory of the NPU node mounted read-only at the same path in the serving
    container."""

    path: str = Field(min_length=2, max_length=1024, pattern=r"^/")
    type: HostPathType = ""
    """The hostPath type. `File`/`Directory` keep the pod from starting when the path is missing on
    the node; `""` mounts without a check (for a path that exists on some nodes only)."""


class HostMountsSpec(ApiModel):
    """The Ascend driver files mounted from the node (the device plugin hands out the NPUs)."""

    generation: NodeGeneration = "A3"
    """Node generation whose mounts to use (vllm-ascend's container guides): `A2` (910B: npu-smi in
    /usr/local/sbin, /etc/hccn.conf), `A3` (npu-smi in /usr/local/bin), `A5` (950: /etc/hccl_rootinfo.json,
    /etc/hixlep, no hccn.conf), or `none` for only `paths`."""
    paths: list[HostPathMount] = Field(default_factory=list, max_length=32)
    """Extra mounts; one with the same path as a generation mount replaces it (e.g. to change its type).
    Each must be a normalised path the cluster admin allows (the operator chart's hostPaths; by default
    the generations' driver and tool paths and /data); the node's credentials and runtime directories
    (/var/lib/kubelet, /etc/kubernetes, /var/run, ...) and their parents never are."""


MAX_INSTANCES = 512


class MetricTarget(ApiModel):
    """One vLLM serving metric and the average per instance the HPA keeps it at."""

    metric: VllmMetric
    """vLLM's Prometheus metric (vllm/v1/metrics/loggers.py @ v0.34.0). Prefill:
    `vllm:num_requests_waiting` (queued requests), `vllm:time_to_first_token_seconds` (mean TTFT over
    the adapter's window, seconds). Decode: `vllm:kv_cache_usage_perc` (0 to 1),
    `vllm:num_requests_running`. The HPA reads it as a Pods metric of the custom metrics API (docs/scaling.md,
    Autoscaling: the adapter rules)."""
    average_value: float = Field(ge=0.001, le=1_000_000)
    """Target average per instance: more instances above it, fewer below it (in the metric's unit:
    requests, seconds or a fraction; rendered to the nearest 0.001)."""


class ScalingRule(ApiModel):
    """How fast the HPA may change the instance count in one direction."""

    stabilization_window_seconds: int | None = Field(default=None, ge=0, le=3600)
    """The HPA acts on the most conservative recommendation of this window (its default: 0 up, 300
    down)."""
    max_instances: int | None = Field(default=None, ge=1, le=MAX_INSTANCES)
    """At most this many instances added (or removed) per `periodSeconds`; unset: the HPA's default."""
    period_seconds: int = Field(default=60, ge=1, le=1800)


def _gentle_scale_down() -> ScalingRule:
    return ScalingRule(stabilization_window_seconds=300, max_instances=1, period_seconds=60)


class AutoscalingSpec(ApiModel):
    """An HPA for the role (rendered as `<name>-<role>`, scaling the role's PDRole): it owns the
    role's instance count while this is set."""

    min_replicas: int = Field(default=1, ge=1, le=MAX_INSTANCES)
    max_replicas: int = Field(ge=1, le=MAX_INSTANCES)
    metrics: list[MetricTarget] = Field(min_length=1, max_length=4)
    """The HPA scales to the largest count any of them asks for."""
    scale_up: ScalingRule = Field(default_factory=ScalingRule)
    scale_down: ScalingRule = Field(default_factory=_gentle_scale_down)
    """Defaults to one instance a minute after 5 minutes of lower load: a removed instance drains
    first."""


@cel("(has(self.maxUnavailable) ? self.maxUnavailable : 0) > 0 || "
     "(has(self.maxSurge) ? self.maxSurge : 1) > 0",
     "maxUnavailable and maxSurge cannot both be 0: no instance could move")
class RolloutSpec(ApiModel):
    """How a change of the role's pod template (image, engine arguments, env, resources) reaches its
    running instances (controller/rollout.py), named as a Deployment's rolling update and a
    StatefulSet's partition are. An instance moves whole, the way a scale-down removes one: it
    leaves the proxy, drains, its pods are replaced, and it re-joins once all of them are Ready on
    the new template (decode: once its KV link passes too). Old and new instances of different KV
    layouts are never paired. The defaults (one surge instance, none unavailable, as LWS's
    DisaggregatedSet) keep every instance of the role serving through the rollout, a role of one
    instance too, at the cost of one more instance's NPUs while it runs."""

    max_unavailable: int = Field(default=0, ge=0, le=MAX_INSTANCES)
    """At most this many of the role's `replicas` instances are out of service at once (leaving,
    being replaced, new and still loading, or un-Ready), counted against `replicas` with the surge
    instances that serve standing in: an instance leaves only while at least `replicas -
    maxUnavailable` others serve or may again. 0 (the default): an instance leaves only once a surge
    instance serves in its place, so the role never serves fewer than `replicas` because of the
    rollout (needs `maxSurge`). The serving prefill:decode ratio stays within spec.scaling.ratio
    whatever this allows."""
    max_surge: int = Field(default=1, ge=0, le=MAX_INSTANCES)
    """Up to this many extra instances on the new template run while outdated ones remain (they need
    NPUs of their own: with none free they stay Pending and status says so); they come up first and
    leave, drained, once the instances they stood in for serve again. With the default
    `maxUnavailable` 0, 1 here keeps every instance serving, a role of one instance and a KV-layout
    change (a new image, block size or TP) too; with `maxUnavailable` above 0 it only speeds the
    rollout up. 0 (with `maxUnavailable` 1 or more) replaces in place: a role of one instance then
    serves nothing while its instance is replaced."""
    partition: int = Field(default=0, ge=0, le=MAX_INSTANCES)
    """Only instances whose ordinal is at or above this move (a canary); those below stay on the old
    template until it is lowered. When the new template changes the KV layout, the other role keeps
    an instance on the held instances' layout for them (the rollout holds there, RolloutBlocked),
    so they never stay on pairing with nothing."""
    paused: bool = False
    """Take no further instance out; those already moving finish."""
    progress_deadline_seconds: int | None = Field(default=None, ge=1, le=7 * 86_400)
    """Seconds without progress (an instance replaced, drained, or Ready, a surge one too) after which
    the rollout stops with Progressing=False/ProgressDeadlineExceeded, keeping the rest serving; the
    clock stops while the rollout is paused or blocked. It rolls nothing back: any spec change resumes
    it (apply the previous spec again to roll back). Unset: the role's `startupTimeoutSeconds` plus
    its drain bound, the longest a healthy replacement takes."""
    revision_history_limit: int = Field(default=10, ge=0, le=1000)
    """Per instance, how many records (ControllerRevisions `<instance>-rev-<hash>`) of revisions none
    of its pods runs are kept, as a StatefulSet's revisionHistoryLimit. The record of the revision an
    instance is on, and of any its pods run, is always kept: an instance not moved yet whose
    StatefulSet is deleted or edited comes back from it. An instance's records go with it."""

    @model_validator(mode="after")
    def _can_move(self) -> RolloutSpec:
        if self.max_unavailable == 0 and self.max_surge == 0:
            raise ValueError("maxUnavailable and maxSurge cannot both be 0: no instance could move")
        return self


class RoleSpec(ApiModel):
    replicas: int = Field(default=1, ge=0, le=MAX_INSTANCES)
    """Instances of this role; each is one vLLM engine (TP x DP x PP NPUs). The role's PDRole
    (`<name>-<role>`) starts with this count and owns it afterwards (`kubectl scale`, an HPA); a later
    change here is forwarded to the PDRole once, unless `autoscaling` is set (the HPA owns it)."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    data_parallel_size: int = Field(default=1, ge=1, le=256)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=16)
    """Prefill only: decode must be 1 (the Mooncake connector pulls into one stage)."""
    npus_per_node: int = Field(default=8, ge=1, le=64)
    """NPUs one node offers; instances larger than this span several pods."""
    npu_resource_name: str = Field(default=ASCEND_NPU, max_length=253)
    block_size: int | None = Field(default=None, ge=1, le=1_048_576)
    """Requested `--block-size`; hybrid models may get a larger engine block (see status.kvLayout)."""
    kernel_block_size: int = Field(default=128, ge=1, le=65_536)
    """Smallest block the attention kernels support (128 on Ascend)."""
    num_speculative_tokens: int = Field(default=0, ge=0, le=64)
    """MTP/speculative tokens; they lengthen the conv state of linear-attention layers."""
    enable_prefix_caching: bool | None = None
    """vLLM's `--enable-prefix-caching` (true) or `--no-enable-prefix-caching` (false) on this role;
    prefill is where reuse saves compute. Unset: off for hybrid models (state caches), vLLM's default
    (on) otherwise. On a hybrid model it runs the state cache in vLLM's "align" mode: the operator plans
    the engine block for it, each running request holds one more state block per layer, and prefix hits
    land on engine block boundaries (status.kvLayout.prefillPrefixHitTokens)."""
    extra_args: list[str] = Field(default_factory=list, max_length=128)
    """Extra `vllm serve` flags; flags the operator renders are refused (finding ArgOverride)."""
    env: list[EnvVar] = Field(default_factory=list, max_length=128)
    """Extra environment; variables the operator sets are refused (finding EnvOverride)."""
    resources: Resources = Field(default_factory=Resources)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[FreeObject] = Field(default_factory=list)
    affinity: FreeObject | None = None
    host_mounts: HostMountsSpec = Field(default_factory=HostMountsSpec)
    host_network: bool = False
    """Use the host network (RDMA setups); the NetworkPolicy cannot isolate such pods."""
    startup_timeout_seconds: int = Field(default=3600, ge=60, le=86_400)
    """How long a pod may take to load the model before it is restarted."""
    autoscaling: AutoscalingSpec | None = None
    """Scale the role on vLLM's serving metrics through an HPA."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """How a template change rolls through the role's instances."""


@cel("self.pipelineParallelSize == 1",
     "decode pipelineParallelSize must be 1: the Mooncake connector pulls KV into one stage")
class DecodeSpec(RoleSpec):
    """The decode role."""


class PrefillSpec(RoleSpec):
    """The prefill role."""


MiB = 1 << 20


class ProxyLimits(ApiModel):
    """What one proxy pod holds at most, and how long it waits; past a bound a client gets a 4xx or
    5xx answer (or its connection closed) instead of the proxy's memory or file descriptors growing.
    pd-proxy reads each field as a command-line option (pd_operator.proxy.options)."""

    header_timeout_seconds: float = Field(default=10, ge=0.5, le=300)
    """A connection must send a request's headers within this long of opening (or of the previous
    answer), else it is closed: half-sent requests (slowloris) do not hold file descriptors."""
    body_timeout_seconds: float = Field(default=60, ge=0.5, le=3600)
    """A request's body must arrive whole within this long of its headers (else 408)."""
    idle_timeout_seconds: float = Field(default=120, ge=0.5, le=3600)
    """The longest a streamed decode answer may stay silent (its first token included: a decode
    that queues the request under load sends nothing meanwhile) and the longest a client may leave
    a stream unread; after it the stream ends (504 when nothing was sent yet) and decode's request
    is cancelled."""
    answer_timeout_seconds: float = Field(default=900, ge=1, le=86_400)
    """The longest wait for an answer that comes whole: prefill's, and decode's when not streamed
    (it is silent until the last token). 504 after it."""
    max_body_bytes: int = Field(default=32 * MiB, ge=4096, le=1024 * MiB)
    """Largest request body (413 above it). 32 MiB holds a 1M-token prompt as text (about 4 bytes a
    token) or as token ids (about 7), or a few high-resolution images as base64 data URLs (a 4K PNG
    is 8-20 MB, a third more as base64)."""
    max_buffered_bytes: int = Field(default=128 * MiB, ge=1 * MiB, le=16_384 * MiB)
    """Request body bytes held at once over all requests; a request whose body would pass it is
    answered 503 with Retry-After before its body is read. Bodies over 1/64 of it may fill only
    three quarters, so large uploads (stalled or not) leave room for ordinary requests. The proxy
    holds up to about 3 bytes per body byte while a request is routed (the body, its parsed form,
    the copy sent on), so its memory stays under about 3 x this plus ~100 MiB; the default memory
    limit (1Gi) allows that."""
    max_concurrent_requests: int = Field(default=1024, ge=1, le=65_536)
    """Requests served at once; more are answered 503 with Retry-After at once, never queued. The
    proxy lowers it at start when its open-file limit could not hold that many (it logs so)."""
    max_client_connections: int = Field(default=1024, ge=16, le=65_536)
    """Client connections held at once, half-sent ones included: past it a new connection closes the
    oldest one between requests, or is refused when every one is inside a request. It bounds what
    unauthenticated clients can hold before the key is checked: each connection's unfinished headers
    are at most about 136 KiB (32 header lines of 4 KiB; aiohttp allows 128 of 8 KiB), so at the
    default the headers stay under about 300 MiB with the parser's copies. The proxy lowers it at
    start when its open-file limit could not hold that many (it logs so)."""
    max_connections_per_source: int = Field(default=256, ge=1, le=65_536)
    """Client connections from one address at once; past it that address's new connections are
    refused (503), so one client cannot take every connection. Behind a gateway or ingress every
    request comes from its few addresses: raise it to what the gateway opens."""
    max_retries: int = Field(default=3, ge=1, le=16)
    """Attempts per call to a role before the client gets the error (as the example proxy's)."""
    max_prefills: int = Field(default=2, ge=1, le=16)
    """Prefills of one request: a decode that failed after it may have pulled the KV needs a new
    prefill, and each one holds prefill KV blocks until its abort timeout."""

    @model_validator(mode="after")
    def _one_body_fits(self) -> ProxyLimits:
        if self.max_buffered_bytes < self.max_body_bytes:
            raise ValueError(f"spec.proxy.limits.maxBufferedBytes ({self.max_buffered_bytes}) is below "
                             f"maxBodyBytes ({self.max_body_bytes}): the largest body could never be read; "
                             "raise maxBufferedBytes or lower maxBodyBytes")
        return self


PrefixRoutingMode = Literal["off", "approximate", "precise"]
"""spec.proxy.routing.prefix, and pd-proxy's --prefix-routing (pd_operator.proxy.prefix_routing)."""


@cel("!has(self.prefillCacheBlocks) || !has(self.prefix) || self.prefix != 'off'",
     "spec.proxy.routing.prefillCacheBlocks is read only with prefix routing on: unset it, or set prefix")
class ProxyRouting(ApiModel):
    """How the proxy chooses a prefill instance (decode is always chosen by load)."""

    prefix: PrefixRoutingMode = "approximate"
    """`approximate`: each request goes to the prefill expected to compute the fewest tokens for it:
    the prompt less the prefix that prefill holds, plus what it is computing already. The proxy
    remembers what it routed where, in blocks of the prefill's engine block
    (status.kvLayout.prefillPrefixHitTokens), within prefillCacheBlocks. `precise`: the same choice,
    by what the prefill engines report they hold: they publish vLLM's KV cache events
    (`--kv-events-config`) on kvEventsPort, which only this deployment's proxy pods may reach, and
    the proxy subscribes to each; needs spec.prefill.enablePrefixCaching. Prompts of token ids are
    keyed by their ids; text prompts and chat requests by their text, 4 characters a token (the proxy
    loads no tokenizer), in `approximate` only: `precise` routes them by load, as every mode routes
    every request when prefill does not cache prefixes. `off`: the prefill with the fewest requests
    in flight."""
    prefill_cache_blocks: int | None = Field(default=None, ge=1, le=10_000_000)
    """Prefix-cache blocks one prefill instance's KV cache holds (vLLM logs it at start-up: the GPU
    KV cache size in tokens over the block size); what the proxy remembers per prefill in approximate
    mode, the least recently routed going first. Unset: 65536 blocks. It counts the blocks of the
    spec's prefill engines: during a rollout, a prefill still on an older revision of another KV
    layout gets the unset bound (its own block size, read from its revision, may differ)."""
    kv_events_port: Port = 5557
    """precise: the prefill engines' KV-events port (vLLM's publisher endpoint); DP rank r of an
    instance publishes on this port + r, on the pod that runs it."""

    @model_validator(mode="after")
    def _blocks_need_prefix_routing(self) -> ProxyRouting:
        if self.prefill_cache_blocks is not None and self.prefix == "off":
            raise ValueError("spec.proxy.routing.prefillCacheBlocks is read only with prefix routing on: "
                             "unset it, or set prefix")
        return self


class SecretKeyRef(ApiModel):
    """A key of a Secret in the PDDeployment's namespace."""

    name: DNSLabel
    key: str = Field(default="api-key", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class LabelSelectorRequirement(ApiModel):
    """One requirement of a label selector (Kubernetes' metav1.LabelSelectorRequirement)."""

    key: str = Field(min_length=1, max_length=317)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = Field(default=None, max_length=64)


class LabelSelector(ApiModel):
    """Kubernetes' label selector: matchLabels and matchExpressions, ANDed; {} selects everything."""

    match_labels: dict[str, str] | None = None
    match_expressions: list[LabelSelectorRequirement] | None = Field(default=None, max_length=16)


class IPBlock(ApiModel):
    """Addresses outside the pod network (a load balancer's or gateway's), as NetworkPolicy's ipBlock."""

    cidr: str = Field(min_length=3, max_length=64)
    except_: list[str] | None = Field(default=None, alias="except", max_length=16)


@cel("has(self.namespaceSelector) || has(self.podSelector) || has(self.ipBlock)",
     "An allowFrom entry needs namespaceSelector, podSelector or ipBlock")
class ClientPeer(ApiModel):
    """Who may open connections, as a NetworkPolicy peer: pods chosen by podSelector in the
    namespaces namespaceSelector chooses (only podSelector: pods of the PDDeployment's namespace;
    only namespaceSelector: every pod there), or an ipBlock alone."""

    namespace_selector: LabelSelector | None = None
    pod_selector: LabelSelector | None = None
    ip_block: IPBlock | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ClientPeer:
        selectors = self.namespace_selector is not None or self.pod_selector is not None
        if not selectors and self.ip_block is None:
            raise ValueError("an allowFrom entry needs namespaceSelector, podSelector or ipBlock")
        if selectors and self.ip_block is not None:
            raise ValueError("an allowFrom entry has either ipBlock or selectors, not both (as a "
                             "NetworkPolicy peer)")
        return self


@cel("!has(self.adminPort) || !has(self.port) || self.adminPort != self.port",
     "spec.proxy.adminPort must differ from spec.proxy.port")
@cel("!has(self.metricsPort) || ((!has(self.port) || self.metricsPort != self.port) && "
     "(!has(self.adminPort) || self.metricsPort != self.adminPort))",
     "spec.proxy.metricsPort must differ from spec.proxy.port and spec.proxy.adminPort")
class ProxySpec(ApiModel):
    """The routing proxy: each request goes to a prefill instance, then to a decode instance. It does
    not terminate TLS: put it behind the cluster's gateway or ingress for that."""

    enabled: bool = True
    replicas: int = Field(default=1, ge=0, le=64)
    port: Port = 8000
    """The clients' port (the Service `<name>-proxy` exposes this one only)."""
    admin_port: Port = 8001
    """The port of /pd/state (what the operator reads to drain) and /reset_prefix_cache: not in the
    Service, and the proxy's NetworkPolicy admits only the operator's namespace to it."""
    metrics_port: Port = 8002
    """The port of /metrics (Prometheus text, no key): the proxy's NetworkPolicy admits the metrics
    scrapers the operator's chart names (metrics.scrapers) to it, and the chart's
    metrics.proxyPodMonitor scrapes it."""
    image: str | None = Field(default=None, max_length=512)
    """The image that runs `pd-proxy`. Defaults to the operator's own image (the chart's `image`), which
    has it: the CPU-only router never pulls the serving image. An image the operator knows not to have
    `pd-proxy` (a vllm-ascend release) is refused (ImageCannotRun)."""
    api_key: SecretKeyRef | None = None
    """A Secret key holding the API key clients must send (`Authorization: Bearer <key>`) on every
    /v1 path. The engines get the same key (VLLM_API_KEY) and the proxy sends it to them, so a client
    cannot reach an engine's /v1 paths without it either. Unset: no authentication (a warning,
    ProxyWithoutApiKey)."""
    allow_from: list[ClientPeer] = Field(default_factory=list, max_length=32)
    """Who else may connect to the clients' port, besides the pods of the PDDeployment's namespace
    (the NetworkPolicy admits no one more): a gateway's namespace, an ingress controller's pods, a
    load balancer's addresses. With `enabled: false` the same peers (and the namespace) reach the
    engines' serving port."""
    limits: ProxyLimits = Field(default_factory=ProxyLimits)
    resources: Resources = Field(default_factory=Resources)
    """Merged over the defaults per key: requests cpu 500m and memory 256Mi, limits memory 1Gi."""
    routing: ProxyRouting = Field(default_factory=ProxyRouting)

    @model_validator(mode="after")
    def _three_ports(self) -> ProxySpec:
        if self.admin_port == self.port:
            raise ValueError(f"spec.proxy.adminPort ({self.admin_port}) must differ from spec.proxy.port: "
                             "the admin endpoints are not for clients")
        if self.metrics_port in (self.port, self.admin_port):
            raise ValueError(f"spec.proxy.metricsPort ({self.metrics_port}) must differ from spec.proxy.port "
                             "and spec.proxy.adminPort: each port has its own callers")
        return self


class RoleBounds(ApiModel):
    """Bounds on one role's instance count, whoever asks for it (spec.<role>.replicas forwarded to the
    PDRole, `kubectl scale`, an HPA)."""

    min_replicas: int = Field(default=0, ge=0, le=MAX_INSTANCES)
    """A request for fewer instances is held here."""
    max_replicas: int | None = Field(default=None, ge=0, le=MAX_INSTANCES)
    """A request for more instances is held here; unset: no bound."""


class RatioBounds(ApiModel):
    """Bounds on prefill instances per decode instance. A scale that would break one is held: the role
    with too many instances runs the most the ratio allows (never more of the other role)."""

    min_prefill_per_decode: float | None = Field(default=None, ge=0.01, le=MAX_INSTANCES)
    """At least this many prefill instances per decode instance: decode is held at prefill / this."""
    max_prefill_per_decode: float | None = Field(default=None, ge=0.01, le=MAX_INSTANCES)
    """At most this many prefill instances per decode instance: prefill is held at decode x this."""


class DrainSpec(ApiModel):
    """How long a removed instance may drain before it is deleted anyway (controller/drain.py). A
    removed prefill instance waits at most spec.kvTransfer.timeouts.abortRequestSeconds: prefill frees
    a request's KV blocks by then whether decode pulled them or not."""

    decode_seconds: int = Field(default=300, ge=0, le=86_400)
    """A removed decode instance is deleted once its running requests finished, or this long after
    it left the proxy."""


class ScalingSpec(ApiModel):
    """Bounds on the instance counts the roles' PDRoles ask for. A count outside them is held at the
    bound (condition ScalingLimited says which and what to change); the PDRole keeps what was asked.
    The minimums must themselves satisfy the ratio."""

    prefill: RoleBounds = Field(default_factory=RoleBounds)
    decode: RoleBounds = Field(default_factory=RoleBounds)
    ratio: RatioBounds = Field(default_factory=RatioBounds)
    drain: DrainSpec = Field(default_factory=DrainSpec)

    def role(self, role: str) -> RoleBounds:
        return self.prefill if role == "prefill" else self.decode


# Kubernetes name formats (k8s.io/apimachinery: pkg/util/validation/validation.go @ v0.36.3): a DNS-1123
# subdomain (object names, schedulerName, priorityClassName) and a label key (optional DNS prefix and "/").
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_KEY = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
             r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
Subdomain = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
GangScheduler = Literal["none", "volcano", "kubernetes"]


@cel("!has(self.queue) || (has(self.gang) && self.gang == 'volcano')",
     "A queue is a Volcano queue: set gang to volcano or drop queue")
class SchedulingSpec(ApiModel):
    """How the pods of one instance are scheduled. An instance larger than a node is several pods
    (one StatefulSet) that only serve together, so a half-placed instance holds NPUs and serves
    nothing. `gang` makes the scheduler place all of an instance's pods or none:

    - `none` (default): pods are scheduled one by one; the status (condition GangScheduling) says
      when an instance has several pods and can therefore be placed in part.
    - `volcano`: for clusters running Volcano (most Ascend clusters): one Volcano PodGroup
      (`scheduling.volcano.sh/v1beta1`) per instance with minMember = its pods and minResources =
      its NPUs, pods handed to the Volcano scheduler. Needs Volcano's PodGroup CRD.
    - `kubernetes`: kube-scheduler's own gang scheduling (Kubernetes 1.36, alpha): one PodGroup
      (`scheduling.k8s.io/v1alpha2`) per instance with a gang policy of minCount = its pods. Needs
      the feature gates GenericWorkload and GangScheduling on kube-apiserver and kube-scheduler and
      `--runtime-config=scheduling.k8s.io/v1alpha2=true` on kube-apiserver.

    Without the API the option needs, nothing more is applied and GangScheduling says so."""

    gang: GangScheduler = "none"
    scheduler_name: Subdomain | None = None
    """The pods' `schedulerName`; defaults to `volcano` with gang volcano, else the cluster's default
    scheduler."""
    queue: Subdomain | None = None
    """The Volcano queue of the PodGroups (gang volcano only); unset: Volcano's default queue."""
    priority_class_name: Subdomain | None = None
    """The pods' PriorityClass (with gang volcano the PodGroups' too, which Volcano orders by)."""

    @model_validator(mode="after")
    def _queue_is_volcanos(self) -> SchedulingSpec:
        if self.queue is not None and self.gang != "volcano":
            raise ValueError("spec.scheduling.queue names a Volcano queue: set spec.scheduling.gang to "
                             "volcano or drop the queue")
        return self


@cel("!has(self.gangTopology) || !self.gangTopology || has(self.domainLabel)",
     "With gangTopology, set domainLabel: the node label of the PodGroups' topology constraint")
class PlacementSpec(ApiModel):
    """Where instances go in the network. With `domainLabel` (a node label naming the network domain
    each node is in: a super-pod, a switch), every pod of one instance is placed in one domain
    (required pod affinity), decode instances prefer the domains prefill instances are in, and
    instances of one role prefer distinct domains (preferred pod affinity and anti-affinity). Nodes
    without the label are not used for multi-pod instances. The NPU counts per node stay what the
    pods request. The role's own `affinity` is kept and these terms are added to it; a required pod
    affinity of its own on a multi-pod role keeps the first pod of an instance from being placed."""

    domain_label: str | None = Field(default=None, min_length=1, max_length=317, pattern=LABEL_KEY)
    """The node label key, for example `topology.kubernetes.io/zone` or a super-pod label."""
    gang_topology: bool = False
    """With gang kubernetes: also give each instance's PodGroup `domainLabel` as its topology
    constraint, so kube-scheduler tries the whole instance in each domain and takes one that fits
    (pod affinity alone fixes the domain with the first pod placed, which may leave the others no
    room). Needs the TopologyAwareWorkloadScheduling feature gate (alpha in 1.36) as well."""

    @model_validator(mode="after")
    def _needs_label(self) -> PlacementSpec:
        if self.gang_topology and self.domain_label is None:
            raise ValueError("spec.placement.gangTopology needs spec.placement.domainLabel")
        return self


@cel("!has(self.placement) || !has(self.placement.gangTopology) || !self.placement.gangTopology || "
     "(has(self.scheduling) && has(self.scheduling.gang) && self.scheduling.gang == 'kubernetes')",
     "With placement.gangTopology, set scheduling.gang to kubernetes: the topology constraint is "
     "kube-scheduler's")
class PDDeploymentSpec(ApiModel):
    model: ModelSpec
    image: ImageSpec
    kv_transfer: KVTransferSpec = Field(default_factory=KVTransferSpec)
    prefill: PrefillSpec
    decode: DecodeSpec
    proxy: ProxySpec = Field(default_factory=ProxySpec)
    serving_port: Port = 8000
    """Port of each engine's OpenAI-compatible HTTP server (`vllm serve --port`)."""
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)

    @model_validator(mode="after")
    def _gang_topology_is_kubernetes(self) -> PDDeploymentSpec:
        if self.placement.gang_topology and self.scheduling.gang != "kubernetes":
            raise ValueError("spec.placement.gangTopology is a constraint of kube-scheduler's PodGroups: "
                             "set spec.scheduling.gang to kubernetes or gangTopology to false")
        return self

    @model_validator(mode="after")
    def _decode_single_stage(self) -> PDDeploymentSpec:
        # The CEL rule says the same to the API server; this keeps pdctl and the webhook in step.
        if self.decode.pipeline_parallel_size != 1:
            raise ValueError("spec.decode.pipelineParallelSize must be 1: the Mooncake connector "
                             "pulls KV into one pipeline stage")
        return self


class ObjectMeta(ApiModel):
    """The parts of metadata the operator reads; the rest is kept as the API server has it."""

    model_config = ApiModel.model_config | {"extra": "ignore"}
    name: str = Field(min_length=1, max_length=253)
    namespace: str = "default"
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class Condition(ApiModel):
    """A Kubernetes API condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str
    observed_generation: int | None = None
    last_transition_time: str | None = None


class InstanceStatus(ApiModel):
    name: str
    """The instance (its StatefulSet)."""
    revision: str
    """The pod-template revision its pods run (label pd.serving.dev/revision); `mixed` while its pods
    are being replaced, empty when it has none."""
    ready: bool
    tools: str | None = None
    """The operator image whose tools its leader pod runs (its `pd-tools` init container): older than
    the operator's own until the instance's next template change (spec.image.toolsUpdate)."""
    vllm_ascend: str | None = None
    """The vllm-ascend its leader pod's image has, as the pod's `pd-image-report` init container
    found it: version, build commit, whether it has the seed change (vllm-ascend PR #16755). Unset
    until that container ran."""


class RoleStatus(ApiModel):
    desired_instances: int = 0
    ready_instances: int = 0
    updated_instances: int = 0
    """Instances whose pods all run `revision` (ready or not)."""
    revision: str = ""
    """The revision of the role's current pod template."""
    shape: str = ""
    """For `kubectl get`: instances x DP x TP (x PP), e.g. `2xDP2xTP4`."""
    instances: list[InstanceStatus] | None = None
    """Every instance with pods (unset: none has)."""


class KVLayoutStatus(ApiModel):
    prefill_block_size: int
    decode_block_size: int
    segment_tokens: int
    """Token runs replicated caches move in: gcd of the two block sizes."""
    hash: str
    """What must match between paired prefill and decode instances (label pd.serving.dev/kv-layout)."""
    prefill_prefix_hit_tokens: int | None = None
    """When prefill caches prefixes: the token boundaries its prefix-cache hits (and block hashes) land on,
    its engine block, with prefix caching on (vLLM's cache_hit_alignment_tokens). Absent when it does not."""
    decode_prefix_hit_tokens: int | None = None
    """The same for decode."""


class KVLinkStatus(ApiModel):
    """The KV link of one decode instance to one prefill instance, as the decode pod's `kv-link`
    probe last found it (latency and throughput of the probe's test pull when it changed state)."""

    decode: str
    prefill: str
    linked: bool
    latency_ms: float | None = None
    gbps: float | None = None
    message: str | None = None
    """Why the link does not work, from the probe."""


RoleName = Literal["prefill", "decode"]


class DrainingStatus(ApiModel):
    """An instance removed by a scale-down, or taken out for a rollout to replace it, that is kept
    until nothing needs it (controller/drain.py)."""

    name: str
    """The instance (its StatefulSet)."""
    role: RoleName
    since: str
    """When it left the proxy's membership."""
    delete_by: str
    """When it is deleted even if something still holds it (the role's drain bound)."""
    waiting_for: str
    """What still holds it: a proxy pod not yet routing by the new membership, requests in flight,
    requests whose KV decode has still to pull."""


class PDDeploymentStatus(ApiModel):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    prefill: RoleStatus | None = None
    decode: RoleStatus | None = None
    kv_layout: KVLayoutStatus | None = None
    kv_links: list[KVLinkStatus] | None = None
    """Per decode/prefill instance pair: whether the proxy may route over it."""
    proxy_endpoint: str | None = None
    """`host:port` of the proxy Service inside the cluster."""
    draining: list[DrainingStatus] | None = None
    """Instances removed by a scale-down, or being replaced by a rollout, that still drain (they left
    the proxy and are deleted or replaced once nothing needs them)."""
    rollout_progress_time: str | None = None
    """When the rollout last progressed (an instance was replaced or became Ready on the new
    template): what spec.<role>.rollout.progressDeadlineSeconds counts from."""


class PDDeployment(ApiModel):
    """Prefill/decode disaggregated vLLM serving with Mooncake KV transfer, KV-checked before start."""

    model_config = ApiModel.model_config | {"extra": "ignore"}
    api_version: Literal["pd.serving.dev/v1alpha1"] = API_VERSION
    kind: Literal["PDDeployment"] = KIND
    metadata: ObjectMeta
    spec: PDDeploymentSpec
    status: PDDeploymentStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    def role(self, role: str) -> RoleSpec:
        return self.spec.prefill if role == "prefill" else self.spec.decode


ROLES: tuple[Literal["prefill"], Literal["decode"]] = ("prefill", "decode")


class PDRoleSpec(ApiModel):
    deployment: DNSLabel
    """The PDDeployment this role belongs to (set by the operator)."""
    role: RoleName
    """Which of its roles (set by the operator)."""
    replicas: int = Field(ge=0, le=MAX_INSTANCES)
    """Instances the role should run: the target of `kubectl scale` and HPAs (the scale subresource).
    The operator sets it when it creates the PDRole and when spec.<role>.replicas of the PDDeployment
    changes, and otherwise only reads it."""


class PDRoleStatus(ApiModel):
    replicas: int = 0
    """Instances the operator runs: spec.replicas held at the PDDeployment's spec.scaling bounds."""
    ready_replicas: int = 0
    """Instances whose pods are all Ready on the wanted KV layout."""
    updated_replicas: int = 0
    """Instances whose pods all run the role's current pod template (the UP-TO-DATE column)."""
    draining: int = 0
    """Instances a scale-down removed that still drain (left the proxy, deleted once nothing needs
    them; the PDDeployment's status.draining names them)."""
    selector: str = ""
    """Label selector of one pod per instance (the leader, which serves vLLM's /metrics): what an HPA
    averages Pods metrics over."""
    conditions: list[Condition] = Field(default_factory=list)


class PDRole(ApiModel):
    """One role (prefill or decode) of a PDDeployment, with a scale subresource: `kubectl scale`, an HPA
    or a KEDA ScaledObject set the role's instance count here. Created and owned by the operator."""

    model_config = ApiModel.model_config | {"extra": "ignore"}
    api_version: Literal["pd.serving.dev/v1alpha1"] = API_VERSION
    kind: Literal["PDRole"] = ROLE_KIND
    metadata: ObjectMeta
    spec: PDRoleSpec
    status: PDRoleStatus | None = None
