"""`pdctl`: check, plan and render prefill/decode pairings without a cluster.

Exit codes: 0 compatible / valid, 1 error findings, 2 unreadable input (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import yaml

from pd_operator.kv import presets
from pd_operator.kv.blocksize import side_layout
from pd_operator.kv.compat import ASCEND_KV_CACHE_DTYPES, DEFAULT_PROMPT_TOKENS, PairReport, check_pair
from pd_operator.kv.hf_config import model_from_hf_config
from pd_operator.kv.pages import LayoutError
from pd_operator.kv.side import ASCEND_KERNEL_BLOCK, PLATFORMS, Side, prefix_caching_on
from pd_operator.kv.summary import report_json, report_table
from pd_operator.kv.transfer_plan import plan_transfer
from pd_operator.render import render, runnable
from pd_operator.render.yaml_text import to_yaml
from pd_operator.spec.pairing import DEFAULT_CONNECTOR, ManifestError, PairInput
from pd_operator.spec.validate import pair_from_manifest

EXIT_OK, EXIT_FINDINGS, EXIT_UNREADABLE = 0, 1, 2


class InputError(Exception):
    """Input pdctl cannot read; printed as one line, exit code 2."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def read_documents(path: str) -> list:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        # libyaml's loader when PyYAML has it: the pure-Python one needs ~0.5 s per MB of input.
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        return [d for d in yaml.load_all(text, Loader=loader) if d is not None]
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read: {err}") from None
    except yaml.YAMLError as err:
        raise InputError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None


def _read_pair(path: str) -> PairInput:
    docs = [d for d in read_documents(path) if isinstance(d, dict) and d.get("kind") == "PDDeployment"]
    if not docs:
        raise InputError(f"{path}: no PDDeployment in the file")
    try:
        return pair_from_manifest(docs[0])
    except ManifestError as err:
        raise InputError(f"{path}: {err}") from None


def _model(args: argparse.Namespace, name: str | None, config: str | None):
    if config:
        try:
            data = json.loads(Path(config).read_text())
            return model_from_hf_config(data, name or Path(config).parent.name or "model")
        except OSError as err:
            raise InputError(f"{config}: cannot read: {err}") from None
        except ValueError as err:  # json.JSONDecodeError and ConfigError are ValueErrors
            raise InputError(f"{config}: {err}") from None
    if not name:
        raise InputError("give a manifest FILE, --model NAME or --model-config config.json")
    try:
        return presets.get(name)
    except KeyError as err:
        raise InputError(err.args[0]) from None


def _pair_from_flags(args: argparse.Namespace) -> PairInput:
    model = _model(args, args.model, args.model_config)
    decode_model = _model(args, args.decode_model, None) if args.decode_model else model

    def side(role: str, m, tp: int, dp: int, pp: int, block: int | None, caching: bool | None) -> Side:
        asked = caching if caching is not None else args.enable_prefix_caching
        return Side(role, m, tp, dp, pp, args.kv_cache_dtype, block or args.block_size,  # type: ignore[arg-type]
                    args.kernel_block_size, args.num_speculative_tokens, f"--{role}", args.platform,
                    prefix_caching=prefix_caching_on(asked, m))

    return PairInput(
        side("prefill", model, args.prefill_tp, args.prefill_dp, args.prefill_pp, args.prefill_block_size,
             args.prefill_enable_prefix_caching),
        side("decode", decode_model, args.decode_tp, args.decode_dp, args.decode_pp, args.decode_block_size,
             args.decode_enable_prefix_caching),
        args.connector)


# Manifest field -> pdctl flag, so what-if findings name the flag to change.
_FLAGS = {"tensorParallelSize": "tp", "dataParallelSize": "dp", "pipelineParallelSize": "pp",
          "blockSize": "block-size", "enablePrefixCaching": "enable-prefix-caching"}
_GLOBAL_FLAGS = {"kernelBlockSize": "--kernel-block-size", "numSpeculativeTokens": "--num-speculative-tokens",
                 "kvCacheDtype": "--kv-cache-dtype", "model": "--decode-model", "dtype": "--decode-model"}


def flag_path(path: str) -> str:
    """`--decode.tensorParallelSize` -> `--decode-tp`; manifest paths are returned unchanged."""
    role, _, name = path.partition(".")
    if not role.startswith("--") or not name:
        return path
    return f"{role}-{_FLAGS[name]}" if name in _FLAGS else _GLOBAL_FLAGS.get(name, path)


def _naive_entries(report: PairReport, prompt_tokens: int) -> int | None:
    if report.plan is None or report.prefill_layout is None or report.decode_layout is None:
        return None
    return plan_transfer(report.prefill_layout, report.decode_layout, prompt_tokens, merge=False).entries


def cmd_plan(args: argparse.Namespace) -> int:
    pair = _read_pair(args.file) if args.file else _pair_from_flags(args)
    connector_path = "spec.kvTransfer.connector" if args.file else "--connector"
    report = check_pair(pair.prefill, pair.decode, connector=pair.connector,
                        prompt_tokens=args.prompt_tokens, connector_path=connector_path)
    findings = [replace(f, path=flag_path(f.path)) for f in [*pair.findings, *report.findings]]
    report = replace(report, findings=findings)
    if args.output == "json":
        print(json.dumps(report_json(report), indent=2))
    else:
        print(report_table(report, naive_entries=_naive_entries(report, args.prompt_tokens)))
    return EXIT_OK if report.compatible else EXIT_FINDINGS


def _pd_documents(path: str) -> list:
    docs = read_documents(path)
    if not docs:
        raise InputError(f"{path}: the file holds no document")
    return docs


def _validator_options(args: argparse.Namespace) -> dict:
    try:
        return runnable.options_of(args)
    except ValueError as err:
        raise InputError(str(err)) from None


def cmd_validate(args: argparse.Namespace) -> int:
    """Every document of every file through the one validator (CRD schema, CEL rules, names,
    ports, overrides, host paths, KV compatibility): what the webhook and the controller would say
    (with the same --allow-host-path as the operator)."""
    options = _validator_options(args)
    worst = EXIT_OK
    for path in args.files:
        try:
            docs = _pd_documents(path)
        except InputError as err:
            print(f"pdctl: {err}", file=sys.stderr)
            worst = max(worst, EXIT_UNREADABLE)
            continue
        for index, doc in enumerate(docs):
            result = runnable.validate(doc, **options)
            meta = doc.get("metadata") if isinstance(doc, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            label = f"{path}" + (f" ({name})" if isinstance(name, str) else "") + \
                (f" [document {index + 1}]" if len(docs) > 1 else "")
            print(f"{label}: {'valid' if result.ok else 'invalid'}")
            for f in result.findings:
                print(f"  {f.line()}")
            if not result.ok:
                worst = max(worst, EXIT_FINDINGS)
    return worst


def cmd_models(args: argparse.Namespace) -> int:
    rows: list[dict] = []
    for name in presets.names():
        model = presets.get(name)
        blocks: dict[int, int | None] = {}
        for tp in (1, 2, 4, 8):
            try:
                blocks[tp] = side_layout(Side("prefill", model, tp)).engine_block_size
            except LayoutError:
                blocks[tp] = None
        kinds = ", ".join(f"{g.kind}:{g.name}x{g.num_layers}" for g in model.groups)
        rows.append({"name": name, "dtype": model.dtype, "groups": kinds, "engineBlockSize": blocks})
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'preset':22}{'block@TP1/2/4/8':>24}  cache groups")
        for r in rows:
            sizes = "/".join("-" if v is None else str(v) for v in r["engineBlockSize"].values())
            print(f"{r['name']:22}{sizes:>24}  {r['groups']}")
    return EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    docs = [d for d in read_documents(args.file) if isinstance(d, dict) and d.get("kind") == "PDDeployment"]
    if not docs:
        raise InputError(f"{args.file}: no PDDeployment in the file")
    manifests: list[dict] = []
    options = _validator_options(args)
    for doc in docs:
        checked = runnable.check(doc, **options)
        result = checked.validation
        if not result.ok:
            for f in result.errors:
                print(f"{args.file}: {f.line()}", file=sys.stderr)
            return EXIT_FINDINGS
        if result.resolved is None:  # e.g. hfConfigMap: only the controller can read the ConfigMap
            print(f"{args.file}: cannot render: the KV layout is not resolved; "
                  f"{' '.join(f.message for f in result.warnings)}".rstrip("; "), file=sys.stderr)
            return EXIT_FINDINGS
        manifests += render(result.resolved, rendered=checked.templates)
    if args.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}, indent=2))
    else:
        print(to_yaml(manifests), end="")
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    """Bad flags end like every other unreadable input: one line on stderr, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_UNREADABLE, f"{self.prog}: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pdctl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="engine block sizes, findings and the transfer plan of a pairing")
    plan.add_argument("file", nargs="?", help="PDDeployment manifest (or - for stdin); else use the flags")
    plan.add_argument("--model", help="preset name (see `pdctl models`)")
    plan.add_argument("--model-config", help="Hugging Face config.json")
    plan.add_argument("--decode-model", help="a different preset on decode (to see the finding)")
    for role in ("prefill", "decode"):
        plan.add_argument(f"--{role}-tp", type=_positive, default=1)
        plan.add_argument(f"--{role}-dp", type=_positive, default=1)
        plan.add_argument(f"--{role}-pp", type=_positive, default=1)
        plan.add_argument(f"--{role}-block-size", type=_positive)
        plan.add_argument(f"--{role}-enable-prefix-caching", action=argparse.BooleanOptionalAction)
    plan.add_argument("--block-size", type=_positive, help="--block-size requested on both roles")
    plan.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                      help="vLLM's prefix caching on both roles (default as the operator renders it: off for "
                           "hybrid models, on otherwise); --prefill-enable-prefix-caching for one role")
    plan.add_argument("--kernel-block-size", type=_positive, default=ASCEND_KERNEL_BLOCK)
    plan.add_argument("--num-speculative-tokens", type=int, default=0, choices=range(0, 65), metavar="N")
    plan.add_argument("--kv-cache-dtype", default="auto", choices=ASCEND_KV_CACHE_DTYPES)
    plan.add_argument("--platform", default="ascend", choices=PLATFORMS,
                      help="whose block rule: vllm-ascend's (the serving image, default) or plain vLLM's")
    plan.add_argument("--connector", default=DEFAULT_CONNECTOR)
    plan.add_argument("--prompt-tokens", type=_positive, default=DEFAULT_PROMPT_TOKENS)
    plan.add_argument("-o", "--output", choices=("table", "json"), default="table")
    plan.set_defaults(run=cmd_plan)

    validate = sub.add_parser("validate", help="check PDDeployment manifests; exit 1 on errors")
    validate.add_argument("files", nargs="+")
    runnable.add_flags(validate)
    validate.set_defaults(run=cmd_validate)

    render_cmd = sub.add_parser("render", help="the Kubernetes manifests a PDDeployment becomes")
    render_cmd.add_argument("file", help="PDDeployment manifest (or - for stdin)")
    render_cmd.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    runnable.add_flags(render_cmd)
    render_cmd.set_defaults(run=cmd_render)

    models = sub.add_parser("models", help="list the built-in model presets")
    models.add_argument("-o", "--output", choices=("table", "json"), default="table")
    models.set_defaults(run=cmd_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except BrokenPipeError:  # `pdctl plan ... | head`: the reader left, nothing to report
        sys.stderr.close()
        return EXIT_OK
    except InputError as err:
        print(f"pdctl: {err}", file=sys.stderr)
        return EXIT_UNREADABLE
    except ValueError as err:  # a bad dtype name and similar: user input, not a bug
        print(f"pdctl: {err}", file=sys.stderr)
        return EXIT_UNREADABLE


if __name__ == "__main__":
    sys.exit(main())
