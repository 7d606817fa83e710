"""Checks a serving pod runs before `exec vllm serve`: is what is about to start the pairing the
operator rendered, on the image the spec described? Pure: the entrypoint
(images/vllm-ascend/entrypoint.py) gathers the facts (the rendered config, the argv, what the
installed vllm-ascend's source registers (pd_operator.image_check), the NPU count, the ports already
bound) and this module judges them.

The rendered config is a small JSON document (`PreflightConfig`) the operator mounts into the pod.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Literal

from pydantic import Field, ValidationError

from pd_operator.findings import Finding
from pd_operator.image_check import Installed, check
from pd_operator.images import ImageCapabilities
from pd_operator.schema import ApiModel

CONFIG_ENV = "PD_PREFLIGHT_CONFIG"
DEFAULT_CONFIG_PATH = "/etc/pd-operator/preflight.json"
ROLE_OF = {"prefill": "kv_producer", "decode": "kv_consumer"}


class PreflightConfig(ApiModel):
    """What the operator rendered for this pod."""

    role: Literal["prefill", "decode"]
    tensor_parallel_size: int = Field(ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size_local: int | None = Field(default=None, ge=1)
    """DP ranks this pod runs; defaults to dataParallelSize (one pod per instance)."""
    engine_block_size: int = Field(ge=1)
    """This side's engine block size, as the KV engine resolved it (rendered as --block-size)."""
    kv_connector: str = Field(min_length=1)
    ports: list[int] = Field(default_factory=list)
    """Every port this pod binds (HTTP, KV handshake, side channel, ...)."""
    image: ImageCapabilities
    """What the spec says the image can do (pd_operator.images), checked against the installed code."""

    @property
    def dp_local(self) -> int:
        return self.data_parallel_size_local or self.data_parallel_size


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


def check_argv(config: PreflightConfig, argv: Sequence[str]) -> list[Finding]:
    flags = flag_values(argv)
    out = []
    expected = {"--tensor-parallel-size": config.tensor_parallel_size,
                "--pipeline-parallel-size": config.pipeline_parallel_size,
                "--data-parallel-size": config.data_parallel_size,
                "--block-size": config.engine_block_size}
    for flag, want in expected.items():
        got = flags.get(flag, "1" if flag != "--block-size" else None)
        if got != str(want):
            out.append(_mismatch(flag, f"vllm serve gets {flag} {got}, but the operator rendered {want} "
                                       "for this pairing."))
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
        if key in extra and extra[key] != want:
            out.append(_mismatch(f"--kv-transfer-config.kv_connector_extra_config.{config.role}.{key}",
                                 f"kv_connector_extra_config.{config.role}.{key} is {extra[key]}, but this "
                                 f"{config.role} runs {want}; vllm-ascend would refuse to start."))
    return out


def check_npus(config: PreflightConfig, npus: int | None) -> list[Finding]:
    need = config.tensor_parallel_size * config.pipeline_parallel_size * config.dp_local
    if npus is None or npus >= need:
        return []
    return [_mismatch("resources", f"This pod sees {npus} NPUs but its {config.dp_local} DP rank(s) of "
                                   f"TP {config.tensor_parallel_size} x PP {config.pipeline_parallel_size} "
                                   f"need {need}.")]


def check_image(config: PreflightConfig, installed: Installed | None) -> list[Finding]:
    if installed is None:
        return [Finding("PreflightImageMismatch", "error", "spec.image.name", "",
                        "No vllm-ascend is installed in this image; use a vllm-ascend serving image.")]
    return check(config.image, installed)


def check_ports(config: PreflightConfig, busy: Collection[int]) -> list[Finding]:
    return [Finding("PreflightPortBusy", "error", f"ports.{port}", "",
                    f"Port {port} is already in use in this pod; vllm serve would fail to bind it.")
            for port in config.ports if port in busy]


def preflight(config: PreflightConfig, argv: Sequence[str], installed: Installed | None, npus: int | None,
              busy_ports: Collection[int]) -> list[Finding]:
    return (check_argv(config, argv) + check_npus(config, npus) + check_image(config, installed)
            + check_ports(config, busy_ports))
