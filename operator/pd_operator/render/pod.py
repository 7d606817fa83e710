"""The pod template of a serving instance: container, ports, volumes, resources and placement."""

from __future__ import annotations

import json
import re

from pd_operator.api.labels import HOSTNAME
from pd_operator.render import kv_probe, scheduling, security, serving_config, tools
from pd_operator.render.command import ENGINE_CONTAINER, pod_command
from pd_operator.render.env import container_env
from pd_operator.render.labels import labels, selector
from pd_operator.render.probes import probes
from pd_operator.render.resources import resources
from pd_operator.spec.host_paths import mounts as host_mounts
from pd_operator.spec.ports import PROBE_RANGE, pod_ports
from pd_operator.spec.validate import Resolved

SHM_SIZE = "32Gi"  # vLLM's worker processes exchange tensors through /dev/shm
TERMINATION_GRACE_SECONDS = 60
PORT_NAMES = {"HTTP": "http", "DP RPC": "dp-rpc"}


def container_ports(ctx: Resolved, role: str) -> list[dict]:
    """Every port of the port plan that vLLM binds in some pod of the instance (the pods share one
    template)."""
    plan, spec = ctx.shapes[role], ctx.deployment.spec
    seen: dict[int, str | None] = {}
    for ordinal in range(plan.pods):
        for rng in pod_ports(spec.kv_transfer.kv_port, spec.serving_port, plan, ordinal,
                             ctx.kv_events_port(role)):
            if rng.name == PROBE_RANGE:
                continue
            for port in range(rng.start, rng.end):
                seen.setdefault(port, PORT_NAMES.get(rng.name))
    out = []
    for port, name in sorted(seen.items()):
        out.append({**({"name": name} if name else {}), "containerPort": port, "protocol": "TCP"})
    return out


def _volume_name(path: str) -> str:
    """`host-` and the path as a DNS label: /usr/local/bin/npu-smi -> host-usr-local-bin-npu-smi."""
    return ("host-" + "-".join(filter(None, re.split(r"[^a-z0-9]+", path.lower()))))[:63].rstrip("-")


def _volumes(ctx: Resolved, role: str, config: str) -> tuple[list[dict], list[dict]]:
    weights = ctx.deployment.spec.model.weights
    config_volume, config_mount = serving_config.volume(config)
    volumes: list[dict] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
                           config_volume, tools.volume()]
    mounts: list[dict] = [{"name": "dshm", "mountPath": "/dev/shm"}, config_mount, tools.mount()]
    for path, kind in host_mounts(ctx.role(role).host_mounts):
        name = _volume_name(path)
        volumes.append({"name": name, "hostPath": {"path": path, **({"type": kind} if kind else {})}})
        mounts.append({"name": name, "mountPath": path, "readOnly": True})
    source = None
    if weights.pvc is not None:
        source = {"persistentVolumeClaim": {"claimName": weights.pvc.claim_name, "readOnly": True}}
    elif weights.host_path is not None:
        source = {"hostPath": {"path": weights.host_path.path, "type": "Directory"}}
    if source is not None:
        volumes.append({"name": "weights", **source})
        sub_path = {"subPath": weights.pvc.sub_path} if weights.pvc and weights.pvc.sub_path else {}
        mounts.append({"name": "weights", "mountPath": weights.mount_path, "readOnly": True, **sub_path})
    return volumes, mounts


def serving_container(ctx: Resolved, role: str, index: int, mounts: list[dict]) -> dict:
    spec, side = ctx.deployment.spec, ctx.role(role)
    return {
        "name": ENGINE_CONTAINER,
        "image": spec.image.name,
        "imagePullPolicy": ctx.serving_pull_policy(),
        "command": pod_command(ctx, role, index),
        "env": container_env(ctx, role),
        "ports": container_ports(ctx, role),
        "resources": resources(side.resources, side.npu_resource_name, ctx.shapes[role].npus_per_pod),
        "volumeMounts": mounts,
        **probes(ctx, role),
        # The device plugin grants the NPUs: no privileged mode, no capabilities (render/security.py).
        "securityContext": dict(security.ENGINE),
    }


def affinity(ctx: Resolved, role: str, index: int) -> dict | None:
    """The user's affinity, plus for an instance of several pods a required anti-affinity that puts
    each of its pods on a node of its own: `npusPerNode` is a node's NPU count, and the ranks of a
    multi-node engine (external DP) are planned one pod per node. Without it the scheduler may
    pack two pods onto a node with NPUs to spare (an A3 node of 16 for pods of 8). Then the network
    domain terms of spec.placement (render/scheduling.py)."""
    out = json.loads(json.dumps(ctx.role(role).affinity or {}))
    if ctx.shapes[role].multi_pod:
        anti = out.setdefault("podAntiAffinity", {})
        anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
            {"labelSelector": {"matchLabels": selector(ctx, role, index)}, "topologyKey": HOSTNAME})
    return dict(scheduling.add_placement(ctx, role, index, out)) or None


def pod_template(ctx: Resolved, role: str, index: int, config: str) -> dict:
    """`config`: the name of the role's revision config (render/serving_config.py config_maps)."""
    side = ctx.role(role)
    volumes, mounts = _volumes(ctx, role, config)
    containers = [serving_container(ctx, role, index, mounts),
                  kv_probe.sidecar(ctx, role, config)]
    spec: dict = {"initContainers": [tools.init_container(ctx), tools.report_container(ctx)],
                  "containers": containers,
                  "volumes": [*volumes, *kv_probe.volumes(ctx, role)],
                  "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS, **ctx.pull_secrets()}
    if side.host_network:
        spec |= {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
    if side.node_selector:
        spec["nodeSelector"] = dict(side.node_selector)
    if side.tolerations:
        spec["tolerations"] = list(side.tolerations)
    if placement := affinity(ctx, role, index):
        spec["affinity"] = placement
    spec |= scheduling.pod_spec_fields(ctx, role, index)
    spec |= security.pod_fields(spec, image=ctx.deployment.spec.image)
    meta: dict = {"labels": labels(ctx, role, index)}
    if annotations := scheduling.pod_annotations(ctx, role, index):
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": spec}
