"""One StatefulSet and one headless Service per role instance (one vLLM engine).

Why a StatefulSet per instance rather than a LeaderWorkerSet: no extra CRD has to be installed
next to the operator, pods get stable DNS names (the DP leader address) from the headless
Service, and the operator restarts a multi-pod group itself, so one pod's restart does not have
to recreate the whole group the way LWS's RecreateGroupOnPodRestart does (kubernetes-sigs/lws:
api/leaderworkerset/v1/leaderworkerset_types.go @ 47a6181).

The StatefulSets update `OnDelete`: a new template reaches no running pod by itself. The rollout
(controller/rollout.py) decides which instance moves when, drains it, writes the new template to its
StatefulSet and deletes its pods (controller/revisions.py: until then the StatefulSet keeps its own
revision); the StatefulSet controller recreates them from the new template. Each pod carries its template's
revision (a hash of the role's template) so the rollout can tell old instances from new ones.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from pd_operator.api.labels import REVISION
from pd_operator.api.types import ROLES, WITH_OPERATOR
from pd_operator.proxy.membership import paired_as
from pd_operator.render import serving_config
from pd_operator.render.labels import metadata, selector
from pd_operator.render.pod import pod_template
from pd_operator.spec.validate import Resolved


def headless_service(ctx: Resolved, role: str, index: int) -> dict:
    name = ctx.names.instance(role, index)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": metadata(ctx, name, role, index),
            "spec": {"clusterIP": "None",
                     # DP ranks must resolve the leader while every pod is still loading (not ready).
                     "publishNotReadyAddresses": True,
                     "selector": selector(ctx, role, index),
                     "ports": [{"name": "http", "port": ctx.deployment.spec.serving_port,
                                "targetPort": "http", "protocol": "TCP"}]}}


REVISION_CHARS = 10


@dataclass(frozen=True)
class Templates:
    """Each role's pod template as its instance 0 runs it, and the role's revision: rendered once
    per Resolved and passed to what needs them (the image check, the StatefulSets, the rollout, the
    gate, the status), as kubernetes-sigs/lws computes its template's revision once and carries it
    as a label (pkg/utils/revision/revision_utils.go NewRevision @ main). Every instance's template
    is instance 0's but for its ordinal, so a role has one revision."""

    leaders: Mapping[str, dict]
    """Per role: instance 0's pod template, its revision label included. Shared: copy before editing."""
    revisions: Mapping[str, str]
    """Per role: the hash of that template (without the label)."""
    sources: Mapping[str, Resolved]
    """Per role: what its templates are rendered from: the spec, or the spec with an older tools image
    or decode block (with_running)."""
    configs: Mapping[str, dict]
    """Per role: its revision config (render/serving_config.py), which the templates name."""
    pairs: Mapping[str, str] = field(default_factory=dict)
    """kv-layout hashes that pair as another (with_running): a decode of the key pairs with a prefill
    of the value. Without an entry a hash pairs as itself."""

    def paired(self, layout: str) -> str:
        """The kv-layout `layout` pairs as (proxy/membership.py paired_as)."""
        return paired_as(self.pairs, layout)


def revision(template: dict) -> str:
    """A pod template's revision: the hash of it, so any change a pod would see gives a new one."""
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:REVISION_CHARS]


def templates(ctx: Resolved) -> Templates:
    configs = serving_config.config_maps(ctx)
    leaders: dict[str, dict] = {}
    revisions: dict[str, str] = {}
    for role in ROLES:
        template = pod_template(ctx, role, 0, configs[role]["metadata"]["name"])
        revisions[role] = revision(template)
        template["metadata"]["labels"][REVISION] = revisions[role]
        leaders[role] = template
    return Templates(leaders, revisions, dict.fromkeys(ROLES, ctx), configs)


def with_running(ctx: Resolved, rendered: Templates, running: Mapping[str, Sequence[tuple[str, str]]],
                 decode_blocks: Sequence[Resolved] = ()) -> Templates:
    """Keep a role on the revision its instances run when the spec, rendered with what changed that
    its engines do not read, reproduces it exactly, so no engine restarts for it:
    - an older tools image: a new operator image (`--tools-image`) reaches a role with its next
      template change, or at once with spec.image.toolsUpdate: WithOperator;
    - for prefill, decode's block as an older revision had it (`decode_blocks`: the spec with each
      such block, spec/validate.py with_decode_block): a decode-only block-size change leaves
      prefill's engines as they run, though its template names decode's side (the kv-layout label,
      the revision config's pairing).

    `running`: per role, the (tools image, revision) of each of its instances' StatefulSets. The
    template names its revision config by a hash of its data, so a revision reproduced also says the
    config is unchanged (older tools need not read a config this operator writes differently); among
    several, the one most instances run. The result's `pairs` map the kv-layout of every block in
    `decode_blocks`, and the spec's, to the one prefill's template carries: they pair with it."""
    any_older = any(image != ctx.tools_image for role in ROLES for image, _ in running.get(role, ()))
    with_operator = ctx.deployment.spec.image.tools_update == WITH_OPERATOR
    if not decode_blocks and (with_operator or not any_older):
        return rendered
    leaders, revisions = dict(rendered.leaders), dict(rendered.revisions)
    sources, configs = dict(rendered.sources), dict(rendered.configs)
    for role in ROLES:
        counted = Counter(running.get(role, ()))
        if counted[(ctx.tools_image, revisions[role])]:
            continue  # an instance already runs the current template
        candidates = [ctx, *decode_blocks] if role == "prefill" else [ctx]
        for (image, running_revision), _ in counted.most_common():
            if with_operator and image != ctx.tools_image:
                continue
            kept = _reproduced(candidates, role, image, running_revision)
            if kept is not None:
                leaders[role], sources[role], configs[role] = kept
                revisions[role] = running_revision
                break
    prefill = sources["prefill"].layout_hash
    pairs = {layout: prefill for layout in {ctx.layout_hash, *(d.layout_hash for d in decode_blocks)}
             if layout != prefill}
    return Templates(leaders, revisions, sources, configs, pairs)


def _reproduced(candidates: Sequence[Resolved], role: str, image: str, running_revision: str
                ) -> tuple[dict, Resolved, dict] | None:
    """(template, source, revision config) of the first candidate whose `role` template, with tools
    `image`, is `running_revision` (the spec's own rendering, candidates[0] with its own tools, is
    known not to be)."""
    for candidate in candidates:
        if candidate is candidates[0] and image == candidate.tools_image:
            continue
        source = replace(candidate, tools_image=image)
        config = serving_config.config_maps(source)[role]
        template = pod_template(source, role, 0, config["metadata"]["name"])
        if revision(template) == running_revision:
            template["metadata"]["labels"][REVISION] = running_revision
            return template, source, config
    return None


def stateful_set(ctx: Resolved, role: str, index: int, rendered: Templates) -> dict:
    """Instance `index` of `role`; `rendered`: templates(ctx)."""
    name = ctx.names.instance(role, index)
    source = rendered.sources[role]
    if index == 0:
        template = json.loads(json.dumps(rendered.leaders[role]))
    else:
        template = pod_template(source, role, index, rendered.configs[role]["metadata"]["name"])
        template["metadata"]["labels"][REVISION] = rendered.revisions[role]
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": metadata(source, name, role, index),
            "spec": {"serviceName": name,
                     "replicas": ctx.shapes[role].pods,
                     # All ranks of an engine start together; ordered start would deadlock the
                     # leader waiting for ranks that are not created yet.
                     "podManagementPolicy": "Parallel",
                     "updateStrategy": {"type": "OnDelete"},
                     "selector": {"matchLabels": selector(ctx, role, index)},
                     "template": template}}
