"""Checks a serving pod runs before `exec vllm serve`: is what is about to start the pairing the
operator rendered, on the image the spec described? Pure: `pd-preflight` (preflight/cli.py) gathers
the facts (the rendered config, the argv, the environment, what the installed vllm-ascend's source
registers (pd_operator.serving_image.installed), the NPUs the device plugin granted, the ports already bound)
and this module judges them.

The rendered config (`PreflightConfig`) is a key of the role's revision config (an immutable
ConfigMap, render/serving_config.py), mounted into every serving pod of the role.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Literal

from pydantic import Field, ValidationError

from pd_operator.api_model import ApiModel
from pd_operator.findings import Finding
from pd_operator.serving_image.capabilities import ImageCapabilities
from pd_operator.serving_image.installed import Installed, check

ROLE_OF = {"prefill": "kv_producer", "decode": "kv_consumer"}
POD_INDEX_ENV = "PD_POD_INDEX"
"""The pod's ordinal in its instance (downward API: the StatefulSet pod-index label)."""


class PreflightConfig(ApiModel):
    """What the operator rendered for the pods of one role."""

    role: Literal["prefill", "decode"]
    tensor_parallel_size: int = Field(ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size_local: int = Field(ge=1)
    """DP ranks each pod runs."""
    pods: int = Field(default=1, ge=1)
    """Pods of one instance; with more than one, pod 0 leads and the others run --headless."""
    engine_block_size: int = Field(ge=1)
    """This side's engine block size, as the KV engine resolved it (rendered as --block-size)."""
    kv_connector: str = Field(min_length=1)
    npus_per_pod: int = Field(ge=1)
    """NPUs each pod requests (TP x PP x local DP ranks)."""
    ports: list[list[int]] = Field(default_factory=list)
    """Every port each pod binds (HTTP, KV handshake, side channel, ...), by pod ordinal."""
    image: ImageCapabilities
    """What the spec says the image can do (pd_operator.serving_image.capabilities), checked against the
    installed code."""


def parse_config(text: str, source: str) -> tuple[PreflightConfig | None, list[Finding]]:
    try:
        return PreflightConfig.model_validate(json.loads(text)), []
    except json.JSONDecodeError as err:
        return None, [Finding("PreflightConfigInvalid", "error", source, "",
                              f"The rendered config {source} is not JSON: {err.msg} at line {err.lineno}.")]
    except ValidationError as err:
        return None, [Finding("PreflightConfigInvalid", "error",
                              f"{source}:" + ".".join(str(p) for p in e["loc"]), "",
                              f"The rendered config {source} is invalid at "
                              f"{'.'.join(str(p) for p in e['loc']) or 'the top level'}: {e['msg']}.")
                      for e in err.errors()]


def flag_values(argv: Sequence[str]) -> dict[str, str]:
    """`--flag value` and `--flag=value` pairs of an argv (the last occurrence wins, as argparse)."""
    out: dict[str, str] = {}
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        name, eq, value = token.partition("=")
        if eq:
            out[name] = value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[name] = argv[i + 1]
    return out


def _mismatch(path: str, message: str) -> Finding:
    return Finding("PreflightShapeMismatch", "error", path, "", message)


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def check_argv(config: PreflightConfig, argv: Sequence[str], ordinal: int | None) -> list[Finding]:
    if len(argv) < 2 or argv[0].rsplit("/", 1)[-1] != "vllm" or argv[1] != "serve":
        return [_mismatch("argv", f"The command is {' '.join(argv[:2])!r}, not the rendered `vllm serve`.")]
    flags = flag_values(argv)
    out = []
    expected: dict[str, int | None] = {
        "--tensor-parallel-size": config.tensor_parallel_size,
        "--pipeline-parallel-size": config.pipeline_parallel_size,
        "--data-parallel-size": config.data_parallel_size,
        "--block-size": config.engine_block_size}
    defaults: dict[str, int | None] = {"--block-size": None}
    if config.pods > 1:
        if ordinal is None:
            return [_mismatch(f"env.{POD_INDEX_ENV}", f"{POD_INDEX_ENV} is not the pod's ordinal, so its DP "
                              "ranks cannot be checked; run the pod from the rendered StatefulSet.")]
        expected |= {"--data-parallel-size-local": config.data_parallel_size_local,
                     "--data-parallel-start-rank": ordinal * config.data_parallel_size_local}
        defaults |= {"--data-parallel-size-local": None, "--data-parallel-start-rank": 0}
        if ("--headless" in argv) != (ordinal > 0):
            out.append(_mismatch("--headless", f"Pod {ordinal} of the instance must "
                                 f"{'run' if ordinal else 'not run'} --headless."))
    for flag, want in expected.items():
        got = _int(flags.get(flag)) if flag in flags else defaults.get(flag, 1)
        if got != want:
            out.append(_mismatch(flag, f"vllm serve gets {flag} {flags.get(flag, got)}, but the operator "
                                       f"rendered {want} for this pod."))
    raw = flags.get("--kv-transfer-config")
    if raw is None:
        return out + [_mismatch("--kv-transfer-config", "vllm serve has no --kv-transfer-config, so it "
                                "would serve without disaggregation.")]
    try:
        kv = json.loads(raw)
        if not isinstance(kv, dict):
            raise ValueError("not an object")
    except ValueError as err:
        return out + [_mismatch("--kv-transfer-config", f"--kv-transfer-config is not a JSON object: {err}.")]
    if kv.get("kv_connector") != config.kv_connector:
        out.append(_mismatch("--kv-transfer-config.kv_connector",
                             f"kv_connector is {kv.get('kv_connector')!r}, the operator rendered "
                             f"{config.kv_connector!r}."))
    if kv.get("kv_role") != ROLE_OF[config.role]:
        out.append(_mismatch("--kv-transfer-config.kv_role",
                             f"kv_role is {kv.get('kv_role')!r}, but this is a {config.role} pod "
                             f"({ROLE_OF[config.role]})."))
    extra = (kv.get("kv_connector_extra_config") or {}).get(config.role) or {}
    for key, want in (("tp_size", config.tensor_parallel_size), ("dp_size", config.data_parallel_size)):
        if extra.get(key) != want:
            out.append(_mismatch(f"--kv-transfer-config.kv_connector_extra_config.{config.role}.{key}",
                                 f"kv_connector_extra_config.{config.role}.{key} is {extra.get(key)}, but "
                                 f"this {config.role} runs {want}; vllm-ascend would refuse to start."))
    return out


def check_npus(config: PreflightConfig, npus: int | None) -> list[Finding]:
    if npus is not None and npus >= config.npus_per_pod:
        return []
    seen = "no NPUs it can count" if npus is None else f"{npus} NPUs"
    return [_mismatch("resources", f"This pod sees {seen} but its {config.data_parallel_size_local} DP "
                                   f"rank(s) of TP {config.tensor_parallel_size} x PP "
                                   f"{config.pipeline_parallel_size} need {config.npus_per_pod}.")]


def check_image(config: PreflightConfig, installed: Installed | None) -> list[Finding]:
    """The one judgement of the image: the spec's claim against what the installed code registers."""
    if installed is None:
        return [Finding("PreflightImageMismatch", "error", "spec.image.name", "",
                        "No vllm-ascend is installed in this image; use a vllm-ascend serving image.")]
    return check(config.image, installed)


def check_ports(config: PreflightConfig, ordinal: int | None, busy: Collection[int]) -> list[Finding]:
    ports = config.ports[ordinal or 0] if config.ports else []
    return [Finding("PreflightPortBusy", "error", f"ports.{port}", "",
                    f"Port {port} is already in use in this pod; vllm serve would fail to bind it.")
            for port in ports if port in busy]


def ordinal_of(env: Mapping[str, str]) -> int | None:
    return _int(env.get(POD_INDEX_ENV))


def preflight(config: PreflightConfig, argv: Sequence[str], env: Mapping[str, str], npus: int | None,
              busy_ports: Collection[int], installed: Installed | None) -> list[Finding]:
    """Every finding about this pod; `installed` is what introspection found of the image's
    vllm-ascend (None: none is installed)."""
    ordinal = ordinal_of(env)
    return (check_argv(config, argv, ordinal) + check_npus(config, npus) + check_image(config, installed)
            + check_ports(config, ordinal, busy_ports))
