"""Run inside `.vllm-venv`: parse `vllm serve` argvs with vLLM's own parser and report the values
of the options the operator owns, plus every option string `vllm serve` knows.

Reads {"argvs": [[...], ...]} as JSON on stdin; prints {"parsed": [{"ok", "error", "values"}],
"options": [...], "setting_owned": [...]} on stdout. The parser is built once (~5 s) for all argvs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

DESTS = ("tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size", "data_parallel_size_local",
         "data_parallel_start_rank", "data_parallel_address", "data_parallel_rpc_port", "headless",
         "block_size", "kv_transfer_config", "port", "host", "dtype", "kv_cache_dtype",
         "served_model_name", "max_model_len", "api_key", "kv_events_config")


def main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    serve_cmd = ServeSubcommand()
    serve = serve_cmd.subparser_init(subparsers)
    options = sorted({o for action in serve._actions for o in action.option_strings})
    # Every option string that writes one of the owned values, aliases included.
    setting_owned = sorted({o for action in serve._actions if action.dest in DESTS
                            for o in action.option_strings})
    parsed = []
    for argv in json.load(sys.stdin)["argvs"]:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = parser.parse_args(argv[1:])
            values = {}
            for dest in DESTS:
                value = getattr(args, dest, None)
                if dest == "kv_transfer_config" and value is not None:
                    value = value.model_dump(mode="json") if hasattr(value, "model_dump") else value
                values[dest] = value
            parsed.append({"ok": True, "error": "", "values": json.loads(json.dumps(values, default=str))})
        except SystemExit as exc:
            parsed.append({"ok": False, "error": f"exit {exc.code}: {err.getvalue().strip()[-400:]}"})
        except Exception as exc:  # noqa: BLE001 - reported to the test
            parsed.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]})
    json.dump({"parsed": parsed, "options": options, "setting_owned": setting_owned}, sys.stdout)


if __name__ == "__main__":
    main()
