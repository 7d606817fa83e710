"""What `pd-kv-probe` is given: the pairing (a manifest, or a model preset and flags), the probe's
geometry built from it, and the local Mooncake engine. Input it cannot use is an InputError: one line
on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from typing import Any

import yaml

from pd_operator.kv import presets
from pd_operator.kv.side import Side
from pd_operator.spec.pairing import DEFAULT_CONNECTOR, ManifestError, PairInput, pair_from_rendered
from pd_operator.transfer.engine import Engine, open_engine
from pd_operator.transfer.probe_geometry import GeometryError, ProbeGeometry, probe_geometry

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class InputError(Exception):
    """Input the probe cannot use; printed as one line, exit code 2."""


def read_manifest(path: str) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read: {err}") from None
    except yaml.YAMLError as err:
        raise InputError(f"{path}: not valid YAML or JSON: {str(err).splitlines()[0]}") from None


def pairing(args: argparse.Namespace) -> PairInput:
    if args.config:
        doc = read_manifest(args.config)
        try:
            return pair_from_rendered(doc)
        except ManifestError as err:
            raise InputError(f"{args.config}: {err}") from None
    if not (args.model and args.prefill_tp and args.decode_tp):
        raise InputError("give --config FILE, or --model, --prefill-tp and --decode-tp")
    try:
        model = presets.get(args.model)
    except KeyError as err:
        raise InputError(f"--model: {err.args[0]}") from None

    def side(role: str, tp: int, pp: int, block: int | None) -> Side:
        return Side(role, model, tp, 1, pp, args.kv_cache_dtype, block,  # type: ignore[arg-type]
                    args.kernel_block_size, args.num_speculative_tokens, f"--{role}")

    return PairInput(side("prefill", args.prefill_tp, args.prefill_pp, args.prefill_block_size),
                     side("decode", args.decode_tp, 1, args.decode_block_size), DEFAULT_CONNECTOR)


POSITIVE_FLAGS = ("prefill_tp", "prefill_pp", "decode_tp", "prefill_block_size", "decode_block_size",
                  "kernel_block_size", "prompt_tokens", "layers")


def geometry(args: argparse.Namespace) -> ProbeGeometry:
    for name in POSITIVE_FLAGS:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"--{name.replace('_', '-')}: {value} must be at least 1")
    try:
        return probe_geometry(pairing(args), args.prompt_tokens, args.layers)
    except GeometryError as err:
        raise InputError(str(err)) from None


def local_hostname(args: argparse.Namespace) -> str:
    return args.local_hostname or os.environ.get("POD_IP") or socket.gethostbyname(socket.gethostname())


def engine(args: argparse.Namespace) -> Engine:
    return open_engine(local_hostname(args))
