"""The ConfigMaps serving pods mount: what their start-up checks and KV-link probes compare against.

Each role's revision config, mounted at /etc/pd: an immutable ConfigMap named by a hash of its
content (`<name>-<role>-<hash>`), never edited in place, which the role's pod template names, so the
template's revision (render/workloads.py) covers it. An old pod whose container restarts, or that
its StatefulSet recreates, reads the config of its own revision, not a newer one (as a StatefulSet's
ControllerRevisions keep each revision's template). A revision's config stays while a pod of it
remains (controller/revisions.py).
- `preflight-<role>.json`: the pairing as the operator rendered it for that role
  (`pd_operator.preflight.checks.PreflightConfig`); `pd-preflight` reads it before it execs `vllm serve`.
- `pairing.json`: a PDDeployment manifest with the model's resolved KV description inline, from
  which both KV-link probe sides (`pd-kv-probe serve|gate --config`) derive the pairing's real run
  geometry.

What changes without a new revision lives elsewhere: the prefill instances a decode gate links
(the proxy's membership ConfigMap, render/proxy.py; without the proxy, the peers ConfigMap here,
`<name>-prefill-peers`, holding spec.prefill.replicas). The kubelet refreshes those in place, so
scaling prefill reaches the decode gates without restarting or rolling decode pods.
"""

from __future__ import annotations

import hashlib
import json

from pd_operator.api.labels import ROLE
from pd_operator.api.types import ROLES
from pd_operator.preflight.checks import PreflightConfig
from pd_operator.render.command import CONFIG_DIR, preflight_config_path
from pd_operator.render.labels import metadata
from pd_operator.spec.ports import PROBE_RANGE, pod_ports
from pd_operator.spec.validate import Resolved

PAIRING_KEY = "pairing.json"
PAIRING_PATH = f"{CONFIG_DIR}/{PAIRING_KEY}"
VOLUME = "pd-serving"
PEERS_VOLUME = "pd-prefill-peers"
PEERS_DIR = "/etc/pd-peers"
PEERS_PATH = f"{PEERS_DIR}/{PAIRING_KEY}"
DIGEST_CHARS = 10


def preflight_key(role: str) -> str:
    return preflight_config_path(role).rsplit("/", 1)[1]


def preflight_config(ctx: Resolved, role: str) -> PreflightConfig:
    side, plan, spec = ctx.role(role), ctx.shapes[role], ctx.deployment.spec
    events = ctx.kv_events_port(role)
    ports = [sorted(p for r in pod_ports(spec.kv_transfer.kv_port, spec.serving_port, plan, ordinal, events)
                    if r.name != PROBE_RANGE for p in range(r.start, r.end))
             for ordinal in range(plan.pods)]
    return PreflightConfig(
        role=role, tensor_parallel_size=side.tensor_parallel_size,  # type: ignore[arg-type]
        pipeline_parallel_size=side.pipeline_parallel_size, data_parallel_size=side.data_parallel_size,
        data_parallel_size_local=plan.dp_local, pods=plan.pods,
        engine_block_size=ctx.engine_block_size(role), kv_connector=spec.kv_transfer.connector,
        npus_per_pod=plan.npus_per_pod, ports=ports, image=ctx.capabilities)


PAIRING_SHAPE = {"tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size", "npus_per_node",
                 "block_size", "kernel_block_size", "num_speculative_tokens"}
"""What the probes read of a role: its shape (the geometry). Not prefill's replicas: scaling is no
new revision (the peers ConfigMap carries them)."""


def pairing_manifest(ctx: Resolved) -> dict:
    """The deployment reduced to what the probes read, with the model's KV description resolved (a
    preset stays a preset), so the probe needs no ConfigMap read to rebuild the pairing."""
    spec = ctx.deployment.spec
    model = spec.model.model_dump(by_alias=True, exclude_none=True, mode="json",
                                  exclude={"hf_config", "hf_config_map", "kv"})
    if spec.model.preset is None:
        model["kv"] = ctx.model.model_dump(by_alias=True, exclude_none=True, mode="json")
    roles = {role: ctx.role(role).model_dump(by_alias=True, exclude_none=True, mode="json",
                                             include=PAIRING_SHAPE)
             for role in ROLES}
    kv = {"connector": spec.kv_transfer.connector, "kvPort": spec.kv_transfer.kv_port}
    return {"apiVersion": ctx.deployment.api_version, "kind": ctx.deployment.kind,
            "metadata": {"name": ctx.deployment.name, "namespace": ctx.deployment.namespace},
            "spec": {"model": model, "kvTransfer": kv,
                     "image": spec.image.model_dump(by_alias=True, exclude_none=True, mode="json",
                                                   exclude={"tools_update"}),
                     "servingPort": spec.serving_port, **roles}}


def config_maps(ctx: Resolved) -> dict[str, dict]:
    """Per role: its revision config, immutable, named by the hash of its data."""
    pairing = json.dumps(pairing_manifest(ctx), indent=2, sort_keys=True) + "\n"
    out: dict[str, dict] = {}
    for role in ROLES:
        data = {preflight_key(role): preflight_config(ctx, role).model_dump_json(by_alias=True) + "\n",
                PAIRING_KEY: pairing}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        name = ctx.names.revision_config(role, hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS])
        meta = metadata(ctx, name, None)
        meta["labels"][ROLE] = role
        out[role] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "immutable": True,
                     "data": data}
    return out


def volume(name: str) -> tuple[dict, dict]:
    """(the pod volume, the container mount) of the revision config `name`."""
    return ({"name": VOLUME, "configMap": {"name": name}},
            {"name": VOLUME, "mountPath": CONFIG_DIR, "readOnly": True})


def peers_config_map(ctx: Resolved) -> dict:
    """Without the proxy, what a decode gate links: every prefill instance of the spec. Mutable, as
    the proxy's membership is."""
    doc = {"metadata": {"name": ctx.deployment.name, "namespace": ctx.deployment.namespace},
           "spec": {"prefill": {"replicas": ctx.role("prefill").replicas}}}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata(ctx, ctx.names.prefill_peers, None),
            "data": {PAIRING_KEY: json.dumps(doc, indent=2, sort_keys=True) + "\n"}}


def peers_volume(ctx: Resolved) -> tuple[dict, dict]:
    """(the pod volume, the container mount) of the peers ConfigMap."""
    return ({"name": PEERS_VOLUME, "configMap": {"name": ctx.names.prefill_peers}},
            {"name": PEERS_VOLUME, "mountPath": PEERS_DIR, "readOnly": True})
