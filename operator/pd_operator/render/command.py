"""The `vllm serve` command of a serving pod, and its `--kv-transfer-config`.

Everything both roles must agree on comes from the one spec, so it matches by construction: the
kv_connector_extra_config carries the real prefill and decode shapes that vllm-ascend checks
against each side's parallel config (vllm-project/vllm-ascend: vllm_ascend/utils.py
check_kv_extra_config @ v0.30.0rc2), and `--block-size` is the engine block
size the KV engine resolved, so vLLM does not recompute a different one.
"""

from __future__ import annotations

import json

from pd_operator.preflight.checks import POD_INDEX_ENV, ROLE_OF
from pd_operator.serving_image import bundle
from pd_operator.spec.ports import DP_RPC_PORT
from pd_operator.spec.reserved import PREFIX_CACHING_OFF, PREFIX_CACHING_ON
from pd_operator.spec.validate import Resolved

PREFLIGHT = "pd-preflight"  # run from the tools bundle (render/tools.py) by the serving image's python3
ENGINE_CONTAINER = "vllm"
"""The serving pod's engine container (render/pod.py)."""
CONFIG_DIR = "/etc/pd"
"""Where serving pods mount their role's revision config (render/serving_config.py)."""
# vLLM 0.34 turns prefix caching on by default, for hybrid models too, where it switches the state cache to
# the "align" mode (kv/blocksize.py). The operator renders what the role's spec.<role>.enablePrefixCaching
# asks, and for a hybrid model without it prefix caching off, so the state cache runs in the mode the
# layout was planned for; extraArgs may not change it (spec/validate.py).


def kv_transfer_config(ctx: Resolved, role: str, index: int) -> dict:
    spec = ctx.deployment.spec
    kv = spec.kv_transfer
    prefill, decode = spec.prefill, spec.decode
    config: dict = {
        "kv_connector": kv.connector,
        "kv_role": ROLE_OF[role],
        "kv_port": str(kv.kv_port),  # a string, as vllm-ascend's docs show
        "engine_id": ctx.names.engine_id(role, index),
        "kv_connector_extra_config": {
            "prefill": {"dp_size": prefill.data_parallel_size, "tp_size": prefill.tensor_parallel_size,
                        "pp_size": prefill.pipeline_parallel_size},
            "decode": {"dp_size": decode.data_parallel_size, "tp_size": decode.tensor_parallel_size},
        },
    }
    if kv.load_failure_policy is not None:
        config["kv_load_failure_policy"] = kv.load_failure_policy
    return config


def serve_argv(ctx: Resolved, role: str, index: int) -> list[str]:
    """The argv every pod of the instance shares; per-pod flags are added by `pod_command`."""
    spec = ctx.deployment.spec
    side, plan = ctx.role(role), ctx.shapes[role]
    argv = ["vllm", "serve", spec.model.name,
            "--served-model-name", spec.model.served_model_name or spec.model.name,
            "--host", "0.0.0.0", "--port", str(spec.serving_port),
            "--tensor-parallel-size", str(side.tensor_parallel_size),
            "--pipeline-parallel-size", str(side.pipeline_parallel_size),
            "--data-parallel-size", str(side.data_parallel_size)]
    if side.data_parallel_size > 1:
        argv += ["--data-parallel-rpc-port", str(DP_RPC_PORT)]
    if plan.multi_pod:
        argv += ["--data-parallel-size-local", str(plan.dp_local),
                 "--data-parallel-address", ctx.names.pod_host(role, index, 0)]
    argv += ["--block-size", str(ctx.engine_block_size(role)),
             "--dtype", ctx.model.dtype,
             "--kv-cache-dtype", spec.model.kv_cache_dtype]
    if side.enable_prefix_caching is not None or ctx.model.is_hybrid:
        argv.append(PREFIX_CACHING_ON if ctx.layouts[role].side.prefix_caching else PREFIX_CACHING_OFF)
    if spec.model.max_model_len is not None:
        argv += ["--max-model-len", str(spec.model.max_model_len)]
    argv += ["--kv-transfer-config",
             json.dumps(kv_transfer_config(ctx, role, index), separators=(",", ":"))]
    if (events := kv_events_config(ctx, role)) is not None:
        argv += ["--kv-events-config", json.dumps(events, separators=(",", ":"))]
    return argv + list(side.extra_args)


def kv_events_config(ctx: Resolved, role: str) -> dict | None:
    """vLLM's KVEventsConfig for precise prefix routing (vllm-project/vllm: vllm/config/kv_events.py
    @ v0.34.0): block events published over ZMQ on every interface at the events port, which each DP
    rank offsets by its rank (spec/ports.py kv_events); None when the role publishes none."""
    port = ctx.kv_events_port(role)
    if port is None:
        return None
    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}


def serve_argv_of(stateful_set: dict) -> list[str] | None:
    """The `vllm serve` argv a rendered serving StatefulSet's engines run (pod_command: what follows
    pd-preflight's `--`), or None when its engine container has none (not one this module rendered)."""
    containers = stateful_set.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
    command = next((c.get("command") or [] for c in containers if c.get("name") == ENGINE_CONTAINER), [])
    if "--" not in command:
        return None
    argv = command[command.index("--") + 1:]
    return argv if argv[:2] == ["vllm", "serve"] else None


def preflight_config_path(role: str) -> str:
    return f"{CONFIG_DIR}/preflight-{role}.json"


def pod_command(ctx: Resolved, role: str, index: int) -> list[str]:
    """The container command: `pd-preflight` (the tools bundle's, run by the image's python3) checks
    the pod against the rendered pairing, then execs `vllm serve`. In a multi-pod instance all pods
    share one template, so a short shell prelude first appends the flags that depend on the pod's
    ordinal (downward API, PD_POD_INDEX): the DP start rank and the non-leaders' --headless. The argv
    reaches the shell as its positional parameters ("$@"), never as script text, so the JSON argument
    needs no quoting."""
    argv = [*bundle.command(PREFLIGHT), "--config", preflight_config_path(role), "--",
            *serve_argv(ctx, role, index)]
    plan = ctx.shapes[role]
    if not plan.multi_pod:
        return argv
    steps = ["set -e",
             f'if [ "${POD_INDEX_ENV}" -gt 0 ]; then set -- "$@" --headless; fi',
             f'set -- "$@" --data-parallel-start-rank "$(({POD_INDEX_ENV} * {plan.dp_local}))"',
             'exec "$@"']
    return ["/bin/sh", "-c", "; ".join(steps), "pd-serve", *argv]
