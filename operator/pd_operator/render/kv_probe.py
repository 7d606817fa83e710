"""The KV-link probe sidecar on prefill pods: `pd-kv-probe serve` (pd_operator.transfer.probe).

It publishes a test KV buffer laid out with this pairing's real engine block sizes on
ports.PROBE_PORT; a decode-side `pd-kv-probe check --peer <prefill leader>:PROBE_PORT` pulls it
through Mooncake and verifies every byte, which proves the network path and the layout before
traffic is routed to the pair. The probe takes its pairing from a preset, so models described
inline (hfConfig, hfConfigMap, kv) get no sidecar. It moves host memory, so it always uses the
tcp transport: the NPU transports are exercised by the engine itself.
"""

from __future__ import annotations

from pd_operator.ports import HANDSHAKE_RPC, PROBE_PORT
from pd_operator.render import mooncake
from pd_operator.render.context import Context

PROBE_COMMAND = "pd-kv-probe"  # console script of this package, installed in the serving image


def wanted(ctx: Context, role: str) -> bool:
    return role == "prefill" and ctx.dep.spec.model.preset is not None


def probe_argv(ctx: Context) -> list[str]:
    prefill, decode = ctx.dep.spec.prefill, ctx.dep.spec.decode
    assert ctx.dep.spec.model.preset is not None
    return [PROBE_COMMAND, "serve", "--port", str(PROBE_PORT),
            "--model", ctx.dep.spec.model.preset,
            "--prefill-tp", str(prefill.tensor_parallel_size),
            "--prefill-pp", str(prefill.pipeline_parallel_size),
            "--decode-tp", str(decode.tensor_parallel_size),
            "--prefill-block-size", str(ctx.engine_block_size("prefill")),
            "--decode-block-size", str(ctx.engine_block_size("decode")),
            "--kernel-block-size", str(prefill.kernel_block_size),
            "--kv-cache-dtype", ctx.dep.spec.model.kv_cache_dtype,
            "--num-speculative-tokens", str(prefill.num_speculative_tokens),
            "--metadata-server", mooncake.metadata_server_url(ctx),
            "--protocol", "tcp"]


def sidecar(ctx: Context) -> dict:
    spec = ctx.dep.spec
    return {
        "name": "kv-probe",
        "image": spec.image.name,
        "imagePullPolicy": spec.image.pull_policy,
        "command": probe_argv(ctx),
        # The probe names its engine after POD_IP; its Mooncake RPC ports stay in the planned range.
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "MC_MIN_RPC_PORT", "value": str(HANDSHAKE_RPC[0])},
                {"name": "MC_MAX_RPC_PORT", "value": str(HANDSHAKE_RPC[1])}],
        "ports": [{"name": "kv-probe", "containerPort": PROBE_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "kv-probe"}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}},
        "securityContext": {"privileged": False, "allowPrivilegeEscalation": False},
    }
