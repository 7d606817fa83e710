"""`pd-kv-probe`: prove a prefill/decode KV link works before serving traffic (a readiness gate).

    pd-kv-probe serve --port 8090 PAIRING                     (prefill side; stays up)
    pd-kv-probe check --peer HOST:8090 PAIRING                (one check; exit 0 ok, 1 failed)
    pd-kv-probe gate --port 8090 --every 30 --config FILE     (decode side; stays up)

PAIRING is `--config FILE` (a PDDeployment manifest, YAML or JSON, as the operator renders it in
pairing.json: read with the API model, spec.pairing.pair_from_rendered) or `--model PRESET --prefill-tp N
--decode-tp N [...]`, plus `--prompt-tokens` and `--layers`. Engines use P2P handshakes over tcp
(`--local-hostname`, default $POD_IP), as vllm-ascend's PD connectors discover peers.

`serve` opens a Mooncake engine, registers every prefill rank's KV tensors for a test prompt, laid
out with the pairing's real engine block size, fills them with the deterministic prompt content and
publishes its segment name, the tensors' addresses and a fingerprint of its side of the geometry as
JSON at `GET /descriptor`. `check` fetches that, refuses a peer whose prefill side, decode TP or
regions differ from its pairing's (probe_geometry.py: decode's block size may differ), pulls every
decode rank's runs of its plan through the transfer engine, verifies every byte and prints
`{ok, latencyMs, gbps, bytes, entries, errors}`. A peer's descriptor is checked field by field
(parse_descriptor) before anything uses it: whatever a peer sends, the check fails with an error
naming what is wrong and the gate keeps answering, since a crashed gate container would restart the
whole multi-pod instance (controller/pods.py counts any container's restarts). `gate` checks every
prefill instance of the deployment in `--peers-config` or `--config` (or the `--peer`s given) every
`--every` seconds, prints one JSON line per round and answers `GET /ready` with 200 while it is
linked (its first linked round passed and fewer than gate_state.FAILURE_THRESHOLD rounds failed
since), 503 otherwise (`GET /link` returns the last round). On the same port it takes the
operator's membership pushes and serves its state (gate_state.py). Bad input: one line on stderr, exit 2.

This module is the command line; each command is in its own module (probe_serve.py, probe_check.py,
probe_gate.py), what they are given in probe_input.py, the geometry in probe_geometry.py.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pd_operator.kv.side import ASCEND_KERNEL_BLOCK
from pd_operator.spec.ports import PROBE_PORT
from pd_operator.transfer.probe_check import cmd_check
from pd_operator.transfer.probe_gate import cmd_gate
from pd_operator.transfer.probe_geometry import DEFAULT_LAYERS, DEFAULT_PROMPT_TOKENS
from pd_operator.transfer.probe_input import EXIT_BAD_INPUT, InputError
from pd_operator.transfer.probe_serve import cmd_serve


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    pair = common.add_argument_group("pairing")
    pair.add_argument("--config", help="PDDeployment manifest (YAML or JSON) to take the pairing from")
    pair.add_argument("--model", help="built-in model preset (see `pdctl models`)")
    pair.add_argument("--prefill-tp", type=int)
    pair.add_argument("--prefill-pp", type=int, default=1)
    pair.add_argument("--decode-tp", type=int)
    pair.add_argument("--prefill-block-size", type=int)
    pair.add_argument("--decode-block-size", type=int)
    pair.add_argument("--kernel-block-size", type=int, default=ASCEND_KERNEL_BLOCK)
    pair.add_argument("--kv-cache-dtype", default="auto")
    pair.add_argument("--num-speculative-tokens", type=int, default=0)
    pair.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS,
                      help=f"test prompt length (default {DEFAULT_PROMPT_TOKENS}, ends mid-block)")
    pair.add_argument("--layers", type=int, default=DEFAULT_LAYERS,
                      help=f"layers per cache group to register (default {DEFAULT_LAYERS})")
    common.add_argument("--local-hostname", help="this engine's IP (default $POD_IP)")

    top = argparse.ArgumentParser(prog="pd-kv-probe", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", parents=[common], help="prefill side: publish a test buffer and stay up")
    serve.add_argument("--host", default="0.0.0.0", help="address of the descriptor endpoint")
    serve.add_argument("--port", type=int, default=PROBE_PORT, help="port of the descriptor endpoint")
    serve.set_defaults(func=cmd_serve)
    check = sub.add_parser("check", parents=[common], help="pull and verify once, exit 0/1")
    check.add_argument("--peer", required=True, help="host:port of a `pd-kv-probe serve`")
    check.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the descriptor")
    check.set_defaults(func=cmd_check)
    gate = sub.add_parser("gate", parents=[common], help="decode side: check every prefill periodically, "
                          "answer /ready")
    gate.add_argument("--host", default="0.0.0.0", help="address of the /ready endpoint")
    gate.add_argument("--port", type=int, default=PROBE_PORT, help="port of the /ready endpoint")
    gate.add_argument("--every", type=float, default=30.0, help="seconds between rounds")
    gate.add_argument("--peer", action="append", default=[],
                      help="host:port of a `pd-kv-probe serve` (repeatable); default: every prefill "
                           "instance --membership lists, else every one of --peers-config or --config")
    gate.add_argument("--peers-config", help="a PDDeployment manifest (re-read every round) whose prefill "
                                             "instances to link, when it is not --config")
    gate.add_argument("--membership", help="the proxy's membership file (re-read every round): link the "
                                           "prefill instances it routes to (the operator's pushes are newer)")
    gate.add_argument("--layout", help="this pod's kv-layout hash: link only the membership's prefill "
                                       "instances on it")
    gate.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for a descriptor")
    gate.set_defaults(func=cmd_gate)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "gate" and not (args.config or args.peer):
        print("pd-kv-probe: gate needs --config (its prefill instances) or --peer", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return int(args.func(args))
    except InputError as err:
        print(f"pd-kv-probe: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
