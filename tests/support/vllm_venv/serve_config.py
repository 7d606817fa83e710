"""Run inside `.vllm-venv`: check `vllm serve` argvs and kv-transfer configs with vLLM's own code.

Reads {"argvs": [[...], ...], "kv_configs": [{...}, ...]} as JSON on stdin; prints one JSON
object per input on stdout: {"ok": bool, "error": str, ...}. The parser is built once (~5 s), which
is why every case goes through one process. It is built as `vllm serve` builds it (vllm-project/vllm:
vllm/entrypoints/cli/serve.py ServeSubcommand @ v0.34.0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def main() -> None:
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cases = json.load(sys.stdin)
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    serve = ServeSubcommand()
    serve.subparser_init(subparsers)
    results = []
    for argv in cases["argvs"]:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = parser.parse_args(argv[1:])  # argv[0] is the `vllm` executable
                serve.validate(args)
                engine = AsyncEngineArgs.from_cli_args(args)
            kv = engine.kv_transfer_config
            results.append({"ok": True, "error": "",
                            "block_size": engine.block_size,
                            "enable_prefix_caching": engine.enable_prefix_caching,
                            "tp": engine.tensor_parallel_size, "dp": engine.data_parallel_size,
                            "dp_local": engine.data_parallel_size_local,
                            "dp_start_rank": engine.data_parallel_start_rank,
                            "dp_address": engine.data_parallel_address,
                            "headless": bool(getattr(args, "headless", False)),
                            "kv_role": kv.kv_role if kv else None, "engine_id": kv.engine_id if kv else None,
                            "kv_events": (dataclasses.asdict(engine.kv_events_config)
                                          if engine.kv_events_config else None)})
        except SystemExit as exc:
            results.append({"ok": False, "error": f"exit {exc.code}: {err.getvalue().strip()[-800:]}"})
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails with it
            results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:800]})
    configs = []
    for data in cases["kv_configs"]:
        try:
            KVTransferConfig(**data)
            configs.append({"ok": True, "error": ""})
        except Exception as exc:  # noqa: BLE001
            configs.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:800]})
    json.dump({"argvs": results, "kv_configs": configs}, sys.stdout)


if __name__ == "__main__":
    main()
