"""The pod template of a serving instance: container, ports, volumes, resources and placement."""

from __future__ import annotations

from pd_operator.api.types import Resources
from pd_operator.ports import pod_ports
from pd_operator.render import kv_probe, mooncake
from pd_operator.render.command import pod_command
from pd_operator.render.context import Context
from pd_operator.render.env import container_env
from pd_operator.render.labels import labels
from pd_operator.render.probes import probes

# Host files the Ascend runtime needs inside the container, with the device plugin handing out the
# NPUs themselves (vllm-ascend's LeaderWorkerSet template; facts.md section 2): (volume, path, type).
ASCEND_HOST_PATHS = (
    ("ascend-driver", "/usr/local/Ascend/driver", "Directory"),
    ("ascend-dcmi", "/usr/local/dcmi", "Directory"),
    ("npu-smi", "/usr/local/bin/npu-smi", "File"),
    ("hccn-conf", "/etc/hccn.conf", "File"),
)
SHM_SIZE = "32Gi"  # vLLM's worker processes exchange tensors through /dev/shm
TERMINATION_GRACE_SECONDS = 60
PORT_NAMES = {"HTTP": "http", "DP RPC": "dp-rpc"}
PROBE_RANGE = "KV-link probe"  # bound by the kv-probe sidecar (kv_probe.py), not by vLLM


def container_ports(ctx: Context, role: str) -> list[dict]:
    """Every port of the port plan that vLLM binds in some pod of the instance (the pods share one
    template)."""
    plan, spec = ctx.plans[role], ctx.dep.spec
    seen: dict[int, str | None] = {}
    for ordinal in range(plan.pods):
        for rng in pod_ports(spec.kv_transfer.kv_port, spec.serving_port, plan, ordinal):
            if rng.name == PROBE_RANGE:
                continue
            for port in range(rng.start, rng.end):
                seen.setdefault(port, PORT_NAMES.get(rng.name))
    out = []
    for port, name in sorted(seen.items()):
        out.append({**({"name": name} if name else {}), "containerPort": port, "protocol": "TCP"})
    return out


def resources(user: Resources, npu_name: str | None = None, npus: int = 0) -> dict:
    """The user's resources with the NPU count of the shape set on both requests and limits
    (extended resources must have requests equal to limits)."""
    requests, limits = dict(user.requests), dict(user.limits)
    if npu_name:
        requests[npu_name] = limits[npu_name] = npus
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _volumes(ctx: Context) -> tuple[list[dict], list[dict]]:
    weights = ctx.dep.spec.model.weights
    volumes: list[dict] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}]
    mounts: list[dict] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    for name, path, kind in ASCEND_HOST_PATHS:
        volumes.append({"name": name, "hostPath": {"path": path, "type": kind}})
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
    if ctx.uses_config_file:
        volumes += [{"name": "mooncake-template", "configMap": {"name": ctx.names.mooncake_config}},
                    {"name": "pd-runtime", "emptyDir": {}}]
        mounts += [{"name": "mooncake-template", "mountPath": mooncake.TEMPLATE_DIR, "readOnly": True},
                   {"name": "pd-runtime", "mountPath": mooncake.RUNTIME_DIR}]
    return volumes, mounts


def serving_container(ctx: Context, role: str, index: int, mounts: list[dict]) -> dict:
    spec, side = ctx.dep.spec, ctx.role(role)
    return {
        "name": "vllm",
        "image": spec.image.name,
        "imagePullPolicy": spec.image.pull_policy,
        "command": pod_command(ctx, role, index),
        "env": container_env(ctx, role),
        "ports": container_ports(ctx, role),
        "resources": resources(side.resources, side.npu_resource_name, ctx.plans[role].npus_per_pod),
        "volumeMounts": mounts,
        **probes(ctx, role),
        # The device plugin grants the NPUs: no privileged mode, no extra capabilities, and no
        # setuid path to gain them (allowPrivilegeEscalation defaults to true when unset).
        "securityContext": {"privileged": False, "allowPrivilegeEscalation": False},
    }


def pod_template(ctx: Context, role: str, index: int) -> dict:
    side = ctx.role(role)
    volumes, mounts = _volumes(ctx)
    containers = [serving_container(ctx, role, index, mounts)]
    if kv_probe.wanted(ctx, role):
        containers.append(kv_probe.sidecar(ctx))
    spec: dict = {"containers": containers, "volumes": volumes,
                  "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS, **ctx.pull_secrets()}
    if side.host_network:
        spec |= {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
    if side.node_selector:
        spec["nodeSelector"] = dict(side.node_selector)
    if side.tolerations:
        spec["tolerations"] = list(side.tolerations)
    if side.affinity:
        spec["affinity"] = side.affinity
    return {"metadata": {"labels": labels(ctx, role, index)}, "spec": spec}
