"""The one validator: `pdctl validate`, the admission webhook and the controller all call `validate`.

It never raises on user input. Every problem becomes a Finding with the manifest field path, in
the order a person would fix them: the document's shape (CRD schema and CEL rules, then the
pydantic model), then each role's topology, ports, overrides and autoscaling, then the host paths
the pods would mount (spec/host_paths.py: the admin's allow-list) and the node access they ask for
(spec/node_access.py: the admin's allowances), then the model description and
what the serving image can serve (pd_operator.serving_image.capabilities), then KV compatibility of
the pair.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from pd_operator.api import serving_metrics
from pd_operator.api.schema_check import schema_problems
from pd_operator.api.types import API_VERSION, KIND, ROLES, PDDeployment, RoleSpec
from pd_operator.api_model import field_path, sentence
from pd_operator.findings import Finding, is_compatible
from pd_operator.kv.blocksize import SideLayout
from pd_operator.kv.compat import PairReport, check_pair
from pd_operator.kv.model import ModelKV
from pd_operator.kv.side import prefix_caching_on
from pd_operator.names import DNS1035_LABEL, Names
from pd_operator.serving_image import capabilities, contents
from pd_operator.serving_image.capabilities import ImageCapabilities
from pd_operator.spec import host_paths, scaling
from pd_operator.spec.host_paths import HostPathPolicy
from pd_operator.spec.layout import layout_hash
from pd_operator.spec.node_access import DEFAULT as NO_NODE_ACCESS
from pd_operator.spec.node_access import NodeAccess
from pd_operator.spec.node_access import findings as node_access_findings
from pd_operator.spec.pairing import ConfigMapReader, ManifestError, PairInput, resolve_model, side_of
from pd_operator.spec.ports import port_findings
from pd_operator.spec.reserved import (
    CHUNKED_PREFILL_OFF,
    OWNED_ENV,
    OWNED_FLAGS,
    PREFIX_CACHING_FLAGS,
    flag_name,
    owned_flag,
)
from pd_operator.spec.topology import InstanceShape, TopologyError, instance_shape


@dataclass(frozen=True)
class Resolved:
    """A PDDeployment the validator found servable, with everything derived from it once: what the
    renderer, the status, the gate, the drain, the KV links and the PDRoles take. It exists only for
    a spec without error findings whose KV layouts resolved, so its fields are never missing."""

    deployment: PDDeployment
    model: ModelKV
    report: PairReport
    shapes: dict[str, InstanceShape]
    """Per role: how one instance is split into pods."""
    layouts: dict[str, SideLayout]
    """Per role: the KV layout the engine pages with."""
    layout_hash: str
    """spec/layout.py: the value of every serving pod's kv-layout label."""
    names: Names
    capabilities: ImageCapabilities
    """What spec.image can serve (serving_image/capabilities.py): the engine env, the preflight's
    claim and the kv-layout hash read it."""
    tools_image: str = contents.DEFAULT_TOOLS_IMAGE
    """The operator's own image (`--tools-image`): the serving pods' init container copies the tools
    bundle from it (serving_image/bundle.py), and the proxy runs from it unless spec.proxy.image says
    otherwise."""
    node_access: NodeAccess = NO_NODE_ACCESS
    """The admin's node-access allowances, and whether every container pulls its image."""

    def proxy_image(self) -> str:
        return self.deployment.spec.proxy.image or self.tools_image

    def role(self, role: str) -> RoleSpec:
        return self.deployment.role(role)

    def replicas(self) -> dict[str, int]:
        return {role: self.deployment.role(role).replicas for role in ROLES}

    def pods_per_instance(self) -> dict[str, int]:
        return {role: self.shapes[role].pods for role in ROLES}

    def engine_block_size(self, role: str) -> int:
        return self.layouts[role].engine_block_size

    def prefix_hit_tokens(self, role: str) -> int | None:
        """Where the role's prefix-cache hits and block hashes land (its engine block with prefix caching
        on), or None when it does not cache prefixes: what a router hashing prompts must use."""
        return self.layouts[role].prefix_hit_tokens

    def kv_events_port(self, role: str) -> int | None:
        """Where the role's engines publish vLLM's KV events (precise prefix routing), or None."""
        return events_port(self.deployment, role)

    def instances(self, surge: Mapping[str, Collection[int]] | None = None) -> list[tuple[str, int]]:
        """(role, index) of every engine instance, prefill first, with `surge` extra ones per role: a
        rollout's, by index past the spec's (controller/rollout.py)."""
        extra = surge or {}
        return [(role, i) for role in ROLES
                for i in sorted(set(range(self.role(role).replicas)) | set(extra.get(role, ())))]

    def serving_pull_policy(self) -> str:
        """spec.image.pullPolicy, or Always when the admin forces it (`--always-pull-images`)."""
        return self.node_access.pull_policy(self.deployment.spec.image.pull_policy)

    def pull_secrets(self) -> dict:
        """The pod spec's imagePullSecrets entry, or nothing."""
        secrets = self.deployment.spec.image.pull_secrets
        return {"imagePullSecrets": [{"name": s} for s in secrets]} if secrets else {}


def events_port(dep: PDDeployment, role: str) -> int | None:
    """The KV-events port of `role`'s engines: prefill's in precise prefix routing, else None."""
    routing = dep.spec.proxy.routing
    return routing.kv_events_port if role == "prefill" and routing.prefix == "precise" else None


def _prefix_routing_findings(dep: PDDeployment, model: ModelKV) -> list[Finding]:
    """Precise prefix routing reads the prefill engines' KV events: it needs a proxy to read them and
    prefill engines that cache prefixes (vLLM publishes no block events otherwise)."""
    if dep.spec.proxy.routing.prefix != "precise":
        return []
    path = "spec.proxy.routing.prefix"
    if not dep.spec.proxy.enabled:
        return [Finding("PrefixRoutingUnusable", "error", path, "",
                        "precise prefix routing is the proxy's, and spec.proxy.enabled is false; set "
                        "prefix to off, or enable the proxy.")]
    if not prefix_caching_on(dep.spec.prefill.enable_prefix_caching, model):
        return [Finding("PrefixRoutingUnusable", "error", path, "",
                        "precise prefix routing reads the blocks prefill engines cache, and prefill does "
                        "not cache prefixes; set spec.prefill.enablePrefixCaching to true, or prefix to "
                        "approximate or off.")]
    return []


@dataclass(frozen=True)
class Validation:
    findings: list[Finding]
    deployment: PDDeployment | None = None
    """The parsed manifest, when its shape is valid (tools show its pairing even when it is not
    servable)."""
    model: ModelKV | None = None
    report: PairReport | None = None
    shapes: dict[str, InstanceShape] = field(default_factory=dict)
    resolved: Resolved | None = None
    """Everything the controller and the renderer need, when the spec can be served: no error
    findings and the KV layouts resolved (not with a check deferred to the controller)."""

    @property
    def ok(self) -> bool:
        """No error findings (a deferred KV check is a warning)."""
        return self.deployment is not None and is_compatible(self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]


def _invalid(path: str, message: str) -> Finding:
    return Finding("InvalidSpec", "error", path, "", message)


def _shape_findings(doc: Any) -> list[Finding]:
    if not isinstance(doc, dict):
        return [_invalid("(root)",
                         "The document must be a mapping with apiVersion, kind, metadata and spec.")]
    out = []
    if doc.get("apiVersion") != API_VERSION:
        out.append(_invalid("apiVersion",
                            f"apiVersion must be {API_VERSION}, not {doc.get('apiVersion')!r}."))
    if doc.get("kind") != KIND:
        out.append(_invalid("kind", f"kind must be {KIND}, not {doc.get('kind')!r}."))
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta.get("name"):
        out.append(_invalid("metadata.name", "metadata.name is required."))
    if out:
        return out
    return [_invalid(path, sentence(message)) for path, message in schema_problems(doc)]


def parse(doc: Any) -> tuple[PDDeployment | None, list[Finding]]:
    """The manifest as the API model, or the reasons it is not one."""
    findings = _shape_findings(doc)
    if findings:
        return None, findings
    try:
        return PDDeployment.model_validate(doc), []
    except ValidationError as err:
        return None, [_invalid(field_path(e["loc"]), sentence(e["msg"])) for e in err.errors()]


def _override_findings(role: str, spec: RoleSpec) -> list[Finding]:
    out = []
    for i, env in enumerate(spec.env):
        if env.name in OWNED_ENV:
            out.append(Finding("EnvOverride", "error", f"spec.{role}.env[{i}]", "",
                               f"{env.name} is set by the operator ({OWNED_ENV[env.name]}); remove it "
                               "from env."))
    for i, arg in enumerate(spec.extra_args):
        flag = owned_flag(arg)
        if flag is not None:
            owner = OWNED_FLAGS[flag].format(role=role)
            given = arg.split("=", 1)[0]
            spelled = flag if given == flag else f"{given} (which vLLM reads as {flag})"
            out.append(Finding("ArgOverride", "error", f"spec.{role}.extraArgs[{i}]", "",
                               f"{spelled} is rendered by the operator from {owner}; remove it from "
                               "extraArgs and set that instead."))
    return out


def _prefix_caching_findings(dep: PDDeployment, model: ModelKV) -> list[Finding]:
    """The prefix-caching flags are rendered from spec.<role>.enablePrefixCaching, and off for a hybrid model
    without it (render/command.py), so extraArgs may not set them there; a hybrid model's prefix caching
    needs chunked prefill, which extraArgs may turn off."""
    out = []
    for role in ROLES:
        spec = dep.role(role)
        rendered = spec.enable_prefix_caching is not None or model.is_hybrid
        for i, arg in enumerate(spec.extra_args):
            name = flag_name(arg)
            if not name or len(name) <= 2:
                continue
            if rendered and any(flag.startswith(name) for flag in PREFIX_CACHING_FLAGS):
                out.append(Finding(
                    "ArgOverride", "error", f"spec.{role}.extraArgs[{i}]", "",
                    f"{name} is rendered by the operator from spec.{role}.enablePrefixCaching (for a hybrid "
                    "model off unless that asks for it, so the state cache runs in the mode its engine block "
                    "was planned for); remove it from extraArgs and set that instead."))
            elif model.is_hybrid and prefix_caching_on(spec.enable_prefix_caching, model) \
                    and len(name) > len("--no-enable-") and CHUNKED_PREFILL_OFF.startswith(name):
                out.append(Finding(
                    "PrefixCachingNeedsChunkedPrefill", "error", f"spec.{role}.extraArgs[{i}]", "",
                    f"spec.{role}.enablePrefixCaching runs the state cache of this hybrid model in vLLM's "
                    "'align' mode, which needs chunked prefill: vLLM would stop at start-up with 'Chunked "
                    f"prefill is required for Mamba prefix caching.'; remove {name} from extraArgs or set "
                    f"spec.{role}.enablePrefixCaching to false."))
    return out


def _role_findings(dep: PDDeployment, role: str) -> tuple[InstanceShape | None, list[Finding]]:
    spec = dep.role(role)
    out = _override_findings(role, spec)
    try:
        plan = instance_shape(spec, f"spec.{role}")
    except TopologyError as err:
        return None, [*out, Finding("NodeTooSmall", "error", err.field, "", str(err))]
    kv = dep.spec.kv_transfer
    out += port_findings(role, kv.kv_port, dep.spec.serving_port, plan, spec.npus_per_node,
                         events_port(dep, role))
    return plan, out


def _proxy_findings(dep: PDDeployment) -> list[Finding]:
    proxy = dep.spec.proxy
    if not proxy.enabled or proxy.api_key is not None:
        return []
    return [Finding("ProxyWithoutApiKey", "warning", "spec.proxy.apiKey", "",
                    "the proxy serves without an API key: any pod of the namespace or of "
                    "spec.proxy.allowFrom may send it requests; set spec.proxy.apiKey to a Secret key (e.g. "
                    f"{{name: {dep.name}-api-key, key: api-key}}) that clients send as "
                    "`Authorization: Bearer <key>`.")]


def _name_findings(dep: PDDeployment, plans: Mapping[str, InstanceShape]) -> list[Finding]:
    if not DNS1035_LABEL.fullmatch(dep.name):
        return [Finding("InvalidName", "error", "metadata.name", "",
                        f"{dep.name!r} cannot prefix the names of Services: use lowercase letters, digits "
                        "and '-', starting with a letter and ending with a letter or digit.")]
    names = Names(dep.name, dep.namespace)
    replicas: dict[str, int] = {role: _most_instances(dep.role(role)) for role in ROLES}
    pods: dict[str, int] = {role: plans[role].pods if role in plans else 1 for role in ROLES}
    out = []
    for name, limit in names.limits(replicas, pods):
        if len(name) > limit:
            out.append(Finding("NameTooLong", "error", "metadata.name", "",
                               f"The child name {name!r} would be {len(name)} characters, over the "
                               f"limit of {limit}; shorten metadata.name by {len(name) - limit}."))
            break
    ids = [names.engine_id(role, i) for role in ROLES for i in range(replicas[role])]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        out.append(Finding("DuplicateEngineId", "error", "metadata.name", "",
                           f"Instances would share KV engine ids {', '.join(dupes)}; rename the "
                           "PDDeployment."))
    return out


def _most_instances(spec: RoleSpec) -> int:
    """The most instances the role can have: an HPA may scale it up to maxReplicas."""
    scaling = spec.autoscaling
    return max(spec.replicas, scaling.max_replicas) if scaling is not None else spec.replicas


def _autoscaling_findings(dep: PDDeployment, role: str) -> list[Finding]:
    scaling = dep.role(role).autoscaling
    if scaling is None:
        return []
    path = f"spec.{role}.autoscaling"
    out = []
    if scaling.min_replicas > scaling.max_replicas:
        out.append(Finding("AutoscalingBounds", "error", f"{path}.minReplicas", "",
                           f"minReplicas {scaling.min_replicas} is above maxReplicas {scaling.max_replicas}; "
                           "raise maxReplicas or lower minReplicas."))
    if dep.role(role).replicas == 0:
        out.append(Finding("AutoscalingBounds", "error", f"spec.{role}.replicas", "",
                           f"replicas 0 with autoscaling: an HPA does not scale a target that has no "
                           f"instances; start {role} with at least minReplicas ({scaling.min_replicas})."))
    fitting = " or ".join(m.vllm for m in serving_metrics.for_role(role))
    seen: dict[str, int] = {}
    for i, target in enumerate(scaling.metrics):
        where = f"{path}.metrics[{i}]"
        metric = serving_metrics.BY_NAME[target.metric]
        if metric.role != role:
            out.append(Finding("AutoscalingMetricRole", "error", f"{where}.metric", "",
                               f"{metric.vllm} measures {metric.role} ({metric.target}) and says nothing "
                               f"about how many {role} instances are needed; scale {role} on {fitting}."))
        if target.metric in seen:
            out.append(Finding("AutoscalingMetricRepeated", "error", f"{where}.metric", "",
                               f"{target.metric} is already targeted by metrics[{seen[target.metric]}]; "
                               "keep one target per metric."))
        seen.setdefault(target.metric, i)
        if metric.upper_bound is not None and target.average_value > metric.upper_bound:
            out.append(Finding("AutoscalingTargetUnreachable", "error", f"{where}.averageValue", "",
                               f"{metric.vllm} never exceeds {metric.upper_bound:g}, so a target of "
                               f"{target.average_value:g} would never add an instance; use a target of at "
                               f"most {metric.upper_bound:g}."))
    return out


def _image_findings(dep: PDDeployment, model: ModelKV | None) -> list[Finding]:
    kernel_blocks = (dep.spec.prefill.kernel_block_size, dep.spec.decode.kernel_block_size)
    return capabilities.findings(dep.spec.image, dep.spec.kv_transfer.connector, model,
                           dep.spec.model.kv_cache_dtype, kernel_blocks)


def spec_rules_only(doc: Any, *, read_config_map: ConfigMapReader | None = None,
                    host_path_policy: HostPathPolicy = host_paths.DEFAULT,
                    tools_image: str = contents.DEFAULT_TOOLS_IMAGE,
                    node_access: NodeAccess = NO_NODE_ACCESS) -> Validation:
    """The spec's own rules on one PDDeployment manifest, without the check that the rendered pods
    can run in their images: not the validator. pdctl, the webhook, the controller and the tests call
    render/runnable.py's `validate`, which runs these and then that check (tests/test_layout.py keeps
    it so). `read_config_map` lets the controller resolve
    `spec.model.hfConfigMap`; without it (pdctl, the webhook) that check is deferred.
    `host_path_policy` is the cluster admin's allow-list of host paths (`--allow-host-path` of
    pd-operator run and pdctl validate); the built-in default otherwise. `tools_image` is the
    operator's own image (`--tools-image`), which the rendered pods take the tools bundle and the proxy
    from. `node_access` is what the admin lets PDDeployments take of the nodes (spec/node_access.py)."""
    dep, findings = parse(doc)
    if dep is None:
        return Validation(findings)
    shapes: dict[str, InstanceShape] = {}
    for role in ROLES:
        plan, role_findings = _role_findings(dep, role)
        findings += role_findings + _autoscaling_findings(dep, role)
        if plan is not None:
            shapes[role] = plan
    findings += host_paths.findings(dep, host_path_policy)
    findings += _proxy_findings(dep)
    findings += node_access_findings(dep, node_access)
    findings += scaling.findings(dep.spec.scaling)
    findings += _name_findings(dep, shapes)
    model, model_findings = resolve_model(dep.spec.model, dep.namespace, read_config_map)
    findings += model_findings
    findings += _image_findings(dep, model)
    if model is None:
        return Validation(findings, dep, None, None, shapes)
    findings += _prefix_caching_findings(dep, model)
    findings += _prefix_routing_findings(dep, model)
    cache_dtype = dep.spec.model.kv_cache_dtype
    report = check_pair(side_of("prefill", dep.spec.prefill, model, cache_dtype),
                        side_of("decode", dep.spec.decode, model, cache_dtype),
                        connector=dep.spec.kv_transfer.connector)
    findings = [*findings, *report.findings]
    resolved = _resolved(dep, model, report, shapes, findings, tools_image, node_access)
    return Validation(findings, dep, model, report, shapes, resolved)


def _resolved(dep: PDDeployment, model: ModelKV, report: PairReport, shapes: dict[str, InstanceShape],
              findings: list[Finding], tools_image: str, access: NodeAccess) -> Resolved | None:
    prefill, decode = report.prefill_layout, report.decode_layout
    image = capabilities.of_image(dep.spec.image)  # None only beside ImageUnknown, an error finding
    if (not is_compatible(findings) or prefill is None or decode is None or image is None
            or set(shapes) != set(ROLES)):
        return None
    layouts = {"prefill": prefill, "decode": decode}
    return Resolved(dep, model, report, dict(shapes), layouts, layout_hash(dep, model, layouts, image),
                    Names(dep.name, dep.namespace), image, tools_image, access)


def with_instances(validation: Validation, instances: Mapping[str, int]) -> Validation:
    """`validation` for the same spec run with other instance counts (what the roles' PDRoles ask for,
    held at spec.scaling): the deployment carries them as spec.<role>.replicas, so everything
    rendered and reported follows, and the names they make are checked again. The spec's own checks
    (autoscaling, bounds) stay about what the user wrote. The KV layout does not depend on the
    counts, so its hash is kept."""
    resolved = validation.resolved
    if resolved is None or resolved.replicas() == dict(instances):
        return validation
    dep = resolved.deployment
    update: dict[str, Any] = {role: dep.role(role).model_copy(update={"replicas": instances[role]})
                              for role in ROLES}
    scaled = dep.model_copy(update={"spec": dep.spec.model_copy(update=update)})
    extra = [f for f in _name_findings(scaled, validation.shapes) if f not in validation.findings]
    findings = [*validation.findings, *extra]
    return dataclasses.replace(validation, findings=findings, deployment=scaled,
                               resolved=dataclasses.replace(resolved, deployment=scaled)
                               if is_compatible(findings) else None)


DECODE_BLOCK = ("block_size", "kernel_block_size")
"""The fields of spec.decode that make decode's engine block and nothing else of prefill's engines."""


def with_decode_block(resolved: Resolved, recorded: RoleSpec) -> Resolved | None:
    """`resolved` with spec.decode's DECODE_BLOCK fields as `recorded` has them (an older revision's),
    its pairing checked again; None when that pairing is not servable. Nothing else changes, so an
    instance of the result pairs with one of `resolved` (kv/compat.py checked each side against the
    same prefill): a decode-only block-size change (vllm-ascend PR #16755's token runs between
    unequal blocks) leaves prefill's engines as they run."""
    dep, model = resolved.deployment, resolved.model
    decode = dep.spec.decode.model_copy(update={name: getattr(recorded, name) for name in DECODE_BLOCK})
    other = dep.model_copy(update={"spec": dep.spec.model_copy(update={"decode": decode})})
    cache_dtype = dep.spec.model.kv_cache_dtype
    report = check_pair(side_of("prefill", dep.spec.prefill, model, cache_dtype),
                        side_of("decode", decode, model, cache_dtype),
                        connector=dep.spec.kv_transfer.connector)
    findings = [*report.findings, *_image_findings(other, model)]
    return _resolved(other, model, report, resolved.shapes, findings, resolved.tools_image,
                     resolved.node_access)


def pair_from_manifest(doc: Any) -> PairInput:
    """The pairing of a user's manifest (`pdctl plan FILE`), read through the spec's rules, so the tool
    pairs what the webhook and the controller pair (it renders no pod, so the images' run check,
    render/runnable.py, is not its to make)."""
    result = spec_rules_only(doc)
    if result.report is None or result.deployment is None:
        problems = result.errors or result.findings
        raise ManifestError("; ".join(f"{f.path}: {f.message}" if f.path else f.message for f in problems))
    kv_findings = set(result.report.findings)
    connector = result.deployment.spec.kv_transfer.connector
    return PairInput(result.report.prefill, result.report.decode, connector,
                     [f for f in result.findings if f not in kv_findings])
