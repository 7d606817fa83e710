"""The environment of a serving container: the operator's owned keys, defaults, then the user's.

The validator refuses user env that names an owned key (EnvOverride), so the three parts never
collide; a user value for a default replaces the default.
"""

from __future__ import annotations

from pd_operator.api.labels import POD_INDEX
from pd_operator.api.types import SecretKeyRef
from pd_operator.render.command import POD_INDEX_ENV
from pd_operator.serving_image import capabilities
from pd_operator.spec.ports import HANDSHAKE_RPC
from pd_operator.spec.reserved import DEFAULT_ENV
from pd_operator.spec.validate import Resolved

# The pod's network interface for HCCL, gloo and torch (HCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME,
# TP_SOCKET_IFNAME in vllm-project/vllm-ascend:
# docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md @ v0.30.0rc2). Pod network: eth0.
POD_INTERFACE = "eth0"


def _value(name: str, value: str | int) -> dict:
    return {"name": name, "value": str(value)}


def _field(name: str, path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def owned_env(ctx: Resolved) -> list[dict]:
    kv = ctx.deployment.spec.kv_transfer
    timeouts = kv.timeouts
    out = [
        _value("VLLM_USE_V2_MODEL_RUNNER", capabilities.model_runner_env(ctx.capabilities, ctx.model)),
        # vLLM would guess the default-route IP; HCCL needs the same address.
        _field("VLLM_HOST_IP", "status.podIP"),
        _field("HCCL_IF_IP", "status.podIP"),
        *(_value(name, POD_INTERFACE) for name in
          ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")),
        # Pin Mooncake's random handshake ports to the range the port plan keeps free.
        _value("MC_MIN_RPC_PORT", HANDSHAKE_RPC[0]),
        _value("MC_MAX_RPC_PORT", HANDSHAKE_RPC[1]),
        _value("VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT", timeouts.abort_request_seconds),
        # Milliseconds: Mooncake's AscendDirect transport reads both in ms (default 3000; Mooncake
        # mooncake-transfer-engine/src/transport/ascend_transport/ascend_direct_transport).
        _value("ASCEND_TRANSFER_TIMEOUT", timeouts.transfer_ms),
        _value("ASCEND_CONNECT_TIMEOUT", timeouts.connect_ms),
        _field(POD_INDEX_ENV, f"metadata.labels['{POD_INDEX}']"),
        # The proxy's API key: vLLM then wants it on every /v1 path (vllm-project/vllm:
        # vllm/entrypoints/serve/middleware/register.py @ v0.34.0 reads VLLM_API_KEY when no --api-key).
        *secret_env(ctx.deployment.spec.proxy.api_key, ENGINE_API_KEY_ENV),
    ]
    return out


ENGINE_API_KEY_ENV = "VLLM_API_KEY"


def secret_env(ref: SecretKeyRef | None, name: str) -> list[dict]:
    """The env var `name` from a Secret key (nothing without one)."""
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}] if ref else []


def _user(env) -> dict:
    out: dict = {"name": env.name}
    if env.value_from is not None:
        out["valueFrom"] = env.value_from
    else:
        out["value"] = env.value or ""
    return out


def container_env(ctx: Resolved, role: str) -> list[dict]:
    user = ctx.role(role).env
    given = {e.name for e in user}
    defaults = [_value(k, v) for k, v in DEFAULT_ENV.items() if k not in given]
    return [*owned_env(ctx), *defaults, *(_user(e) for e in user)]
