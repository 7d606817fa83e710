#!/usr/bin/env python3
"""The stand-in `vllm` of the stock-serving image (support/images/stock-serving): `vllm serve` as a vLLM
OpenAI server with vllm-ascend's Mooncake connector behaves between pods, without a model.

    vllm serve MODEL --host H --port P --served-model-name N --block-size B --kv-transfer-config JSON ...

- Its role is the kv-transfer-config's `kv_role` (kv_producer: prefill, kv_consumer: decode); its engine
  id and side-channel port (`kv_port`) come from there too; `--headless` (the follower pods of a
  multi-pod instance) serves no API and stays up, as vLLM's headless engine cores do.
- The model's cache description comes from the pairing the operator mounts (PAIRING, the engine
  container's /etc/pd/pairing.json; a real engine reads its weights' config.json), through the tools
  bundle's pd_operator (the pod mounts it at /opt/pd-tools; the image has none of ours). The argv's
  `--block-size` must be the engine block size that pairing gives its role: it refuses to start otherwise.
- Prefill answers a request with one token and `kv_transfer_params` as vllm-ascend's connector does
  (vllm-project/vllm-ascend: vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py @ v0.30.0rc2,
  `request_finished`: do_remote_prefill, remote_engine_id, remote_block_ids, remote_host (the pod's
  VLLM_HOST_IP), remote_port (kv_port), remote_request_id), after writing the request's KV (each prefill
  rank's tensors, laid out with the pairing's engine block size, the prompt's content: one token per
  prompt byte, up to MAX_PROMPT_TOKENS) into one of SLOTS slots of a Mooncake-registered arena.
- Decode asks prefill's side channel (HTTP on remote_host:remote_port) where that request's tensors
  are, pulls every decode rank's runs of the transfer plan from prefill's segment over the real Mooncake
  transfer engine (tcp, P2P handshake), checks every byte against the content it expects, logs
  `kv verified: {json}` with the byte count, tells prefill to free the slot, then answers: `max_tokens`
  tokens (at most MAX_ANSWER_TOKENS), streamed as server-sent events when asked. A failed pull or check
  is a 500 answer and a `kv failed:` log line.
- `VLLM_API_KEY` set: every /v1 request needs `Authorization: Bearer <key>` (vLLM's --api-key).

With PD_TEST_ARGV, PD_TEST_ENV or PD_TEST_RECORD set it is the recorder instead (support/recorder.py:
the images tier runs rendered containers to their end with it). Runs on the image's python3 with
aiohttp, numpy and the Mooncake wheel.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections import OrderedDict
from functools import lru_cache
from typing import Any

RECORD_ENV = ("PD_TEST_ARGV", "PD_TEST_ENV", "PD_TEST_RECORD")
PAIRING = os.environ.get("PD_STANDIN_PAIRING", "/etc/pd/pairing.json")
BUNDLE = "/opt/pd-tools"
MAX_PROMPT_TOKENS = 512
SLOTS = 4
MAX_ANSWER_TOKENS = 16
KV_PATH = "/kv/"


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name")
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--kv-transfer-config")
    parser.add_argument("--headless", action="store_true")
    args, _ = parser.parse_known_args(argv)
    return args


def _prompt_tokens(body: dict) -> int:
    """One token per UTF-8 byte of the prompt (or the messages' contents), clipped to the arena's size."""
    if "messages" in body:
        text = "".join(str(m.get("content", "")) for m in body.get("messages") or [] if isinstance(m, dict))
    else:
        text = str(body.get("prompt", ""))
    return max(1, min(MAX_PROMPT_TOKENS, len(text.encode())))


class KV:
    """The engine's side of the KV cache: its Mooncake engine, its registered arena and the geometry
    of a request of n prompt tokens (the pairing's, through the bundle's pd_operator)."""

    def __init__(self, role: str, block_size: int | None) -> None:
        sys.path.insert(0, BUNDLE)
        from pd_operator.spec.pairing import pair_from_rendered
        from pd_operator.transfer.engine import open_engine
        from pd_operator.transfer.probe_input import read_manifest

        self.role = role
        self.pair = pair_from_rendered(read_manifest(PAIRING))
        largest = self.geometry(MAX_PROMPT_TOKENS)
        side = largest.prefill if role == "prefill" else largest.decode
        if block_size != side.engine_block_size:
            raise SystemExit(f"vllm: --block-size {block_size}, but the pairing in {PAIRING} gives {role} "
                             f"engine block size {side.engine_block_size}")
        self.engine = open_engine(os.environ.get("VLLM_HOST_IP") or os.environ["POD_IP"])
        import numpy as np

        from pd_operator.kv.simulate import regions
        from pd_operator.transfer import arena

        if role == "prefill":
            ranks = [regions(largest.prefill, r, *largest.prefill_pool) for r in range(largest.prefill_ranks)]
        else:
            ranks = [regions(largest.decode, r, *largest.decode_pool) for r in range(largest.decode_ranks)]
        self.slot_bytes = sum(arena.region_offsets(list(regs))[1] for regs in ranks)
        self.memory = np.empty(self.slot_bytes * (SLOTS if role == "prefill" else 1), dtype=np.uint8)
        self.engine.register(int(self.memory.ctypes.data), len(self.memory))
        self.lock = threading.Lock()
        self.held: OrderedDict[str, tuple[int, list[dict]]] = OrderedDict()
        """Prefill: request id -> (slot, published regions) of the requests decode has not pulled."""

    @lru_cache(maxsize=64)  # noqa: B019 - one KV per process
    def geometry(self, tokens: int) -> Any:
        from pd_operator.transfer.probe_geometry import probe_geometry

        return probe_geometry(self.pair, tokens, layers=1)

    def prefill(self, request_id: str, tokens: int) -> list[int]:
        """Write the request's KV into a free slot (the oldest held one when none is); its block ids."""
        from pd_operator.transfer.probe_serve import prefill_arena

        geo = self.geometry(tokens)
        with self.lock:
            used = {slot for slot, _ in self.held.values()}
            free = [s for s in range(SLOTS) if s not in used]
            if not free:
                _, (slot, _) = self.held.popitem(last=False)
                free = [slot]
            slot = free[0]
            memory = self.memory[slot * self.slot_bytes: (slot + 1) * self.slot_bytes]
            _, published = prefill_arena(geo, memory)
            self.held[request_id] = (slot, published)
        return [int(b) for b in geo.request.prefill.blocks]

    def descriptor(self, request_id: str, tokens: int) -> bytes | None:
        from pd_operator.transfer.probe_serve import descriptor

        with self.lock:
            held = self.held.get(request_id)
        if held is None:
            return None
        return json.dumps(descriptor(self.engine, self.memory, held[1], self.geometry(tokens))).encode()

    def release(self, request_id: str) -> None:
        with self.lock:
            self.held.pop(request_id, None)

    def pull(self, raw_descriptor: bytes, tokens: int) -> dict:
        """Pull every decode rank's runs of the request's plan from the peer the descriptor names and
        check every byte: {ok, bytes, entries, ms, errors}."""
        from pd_operator.transfer import arena
        from pd_operator.transfer.executor import pull
        from pd_operator.transfer.kv_content import differences
        from pd_operator.transfer.probe_check import ProbeFailure, decode_arena, parse_descriptor
        from pd_operator.transfer.probe_geometry import fingerprint_differences

        geo = self.geometry(tokens)
        result: dict[str, Any] = {"ok": False, "bytes": 0, "entries": 0, "ms": 0.0, "errors": []}
        try:
            desc = parse_descriptor(raw_descriptor)
        except ProbeFailure as err:
            result["errors"].append(str(err))
            return result
        result["segment"] = desc.segment
        if mismatch := fingerprint_differences(geo.fingerprint(), desc.geometry):
            result["errors"].append("prefill holds another pairing: " + "; ".join(mismatch))
            return result
        with self.lock:
            if self.engine.first_buffer(desc.segment) != desc.base:
                result["errors"].append(f"the handshake with {desc.segment} did not return its arena")
                return result
            memory, ranks = decode_arena(geo, self.memory)
            for rank, (rank_memory, views) in enumerate(ranks):
                report = pull(self.engine, geo.request.plan, rank, arena.addresses(views), desc.peers)
                result["bytes"] += report.bytes
                result["entries"] += report.entries
                result["ms"] += report.seconds * 1e3
                result["errors"] += [str(f) for f in report.failures]
                if report.ok:
                    result["errors"] += differences(rank_memory, views, geo.decode, rank, geo.decode_pool,
                                                    [geo.request.decode])
        result["ms"] = round(result["ms"], 3)
        result["planBytes"] = geo.request.plan.bytes
        result["ok"] = not result["errors"] and result["bytes"] == geo.request.plan.bytes
        return result


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        from aiohttp import ClientSession, ClientTimeout, web

        self.web, self.args = web, args
        config = json.loads(args.kv_transfer_config or "{}")
        role = config.get("kv_role")
        if role not in ("kv_producer", "kv_consumer"):
            raise SystemExit(f"vllm: --kv-transfer-config kv_role {role!r}: the stand-in serves PD roles")
        self.role = "prefill" if role == "kv_producer" else "decode"
        self.engine_id = str(config.get("engine_id", ""))
        self.kv_port = int(config.get("kv_port", 0))
        self.model = args.served_model_name or args.model
        self.key = os.environ.get("VLLM_API_KEY")
        self.kv = KV(self.role, args.block_size)
        self.session_factory = lambda: ClientSession(timeout=ClientTimeout(total=30))
        self.app = web.Application()
        self.app.router.add_get("/health", lambda _: web.Response(text=""))
        self.app.router.add_get("/v1/models", self.models)
        for path in ("/v1/completions", "/v1/chat/completions"):
            self.app.router.add_post(path, self.completions)
        self.side = web.Application()  # prefill's side channel, on kv_port
        self.side.router.add_get(KV_PATH + "{request_id}/{tokens}", self.kv_descriptor)
        self.side.router.add_post(KV_PATH + "{request_id}/done", self.kv_done)

    def log(self, what: str, doc: dict) -> None:
        print(f"{what}: {json.dumps(doc, sort_keys=True)}", flush=True)

    def error(self, status: int, message: str) -> Any:
        kind = {400: "BadRequestError", 401: "Unauthorized"}.get(status, "InternalServerError")
        return self.web.json_response({"error": {"message": message, "type": kind, "param": None,
                                                 "code": status}}, status=status)

    async def models(self, request: Any) -> Any:
        return self.web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def kv_descriptor(self, request: Any) -> Any:
        raw = self.kv.descriptor(request.match_info["request_id"], int(request.match_info["tokens"]))
        if raw is None:
            return self.web.json_response({"error": "no such request held"}, status=404)
        return self.web.Response(body=raw, content_type="application/json")

    async def kv_done(self, request: Any) -> Any:
        self.kv.release(request.match_info["request_id"])
        return self.web.json_response({"ok": True})

    async def completions(self, request: Any) -> Any:
        if self.key and request.headers.get("Authorization") != f"Bearer {self.key}":
            return self.error(401, "Unauthorized")
        try:
            body = await request.json()
        except ValueError:
            return self.error(400, "the body is not JSON")
        request_id = request.headers.get("X-Request-Id") or f"standin-{time.monotonic_ns()}"
        chat = request.path.endswith("chat/completions")
        tokens = _prompt_tokens(body)
        params = body.get("kv_transfer_params") or {}
        if self.role == "prefill":
            if params.get("do_remote_decode") is not True:
                return self.error(400, "prefill serves remote-decode requests only")
            blocks = await asyncio.to_thread(self.kv.prefill, request_id, tokens)
            return self.answer(request_id, chat, tokens, ["x"], {
                "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": blocks,
                "remote_engine_id": self.engine_id, "remote_request_id": request_id,
                "remote_host": os.environ.get("VLLM_HOST_IP"), "remote_port": self.kv_port})
        missing = [k for k in ("remote_host", "remote_port", "remote_request_id") if not params.get(k)]
        if params.get("do_remote_prefill") is not True or missing:
            return self.error(400, f"decode needs kv_transfer_params from prefill (missing {missing})")
        side = f"http://{params['remote_host']}:{params['remote_port']}{KV_PATH}{params['remote_request_id']}"
        async with self.session_factory() as session:
            async with session.get(f"{side}/{tokens}") as answer:
                raw = await answer.read()
                status = answer.status
            result = (await asyncio.to_thread(self.kv.pull, raw, tokens) if status == 200 else
                      {"ok": False, "errors": [f"the side channel {side} answered {status}: {raw[:200]!r}"]})
            result |= {"request": request_id, "from": params.get("remote_engine_id"), "promptTokens": tokens}
            async with session.post(f"{side}/done"):
                pass
        if not result["ok"]:
            self.log("kv failed", result)
            return self.error(500, f"KV transfer of {request_id} failed: {'; '.join(result['errors'])[:500]}")
        self.log("kv verified", result)
        count = min(int(body.get("max_tokens") or body.get("max_completion_tokens") or MAX_ANSWER_TOKENS),
                    MAX_ANSWER_TOKENS)
        words = [f"t{i} " for i in range(max(1, count))]
        if body.get("stream"):
            return await self.stream(request, request_id, chat, tokens, words, body)
        return self.answer(request_id, chat, tokens, words, None)

    def usage(self, tokens: int, completion: int) -> dict:
        return {"prompt_tokens": tokens, "completion_tokens": completion, "total_tokens": tokens + completion,
                "prompt_tokens_details": {"cached_tokens": 0}}

    def answer(self, request_id: str, chat: bool, tokens: int, words: list[str], params: dict | None) -> Any:
        text = "".join(words)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": text, "finish_reason": "length"})
        doc = {"id": f"cmpl-{request_id}", "object": "chat.completion" if chat else "text_completion",
               "model": self.model, "choices": [choice], "usage": self.usage(tokens, len(words))}
        if params is not None:
            doc["kv_transfer_params"] = params
        return self.web.json_response(doc)

    async def stream(self, request: Any, request_id: str, chat: bool, tokens: int, words: list[str],
                     body: dict) -> Any:
        out = self.web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await out.prepare(request)
        for i, word in enumerate(words):
            end = "length" if i == len(words) - 1 else None
            choice = ({"index": 0, "delta": {"content": word}, "finish_reason": end} if chat
                      else {"index": 0, "text": word, "finish_reason": end})
            chunk = {"id": f"cmpl-{request_id}", "model": self.model, "choices": [choice],
                     "object": "chat.completion.chunk" if chat else "text_completion"}
            await out.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            tail = {"id": f"cmpl-{request_id}", "model": self.model, "choices": [],
                    "usage": self.usage(tokens, len(words))}
            await out.write(b"data: " + json.dumps(tail).encode() + b"\n\n")
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    async def run(self) -> None:
        web = self.web
        runners = [web.AppRunner(self.app, access_log=None)]
        if self.role == "prefill":
            runners.append(web.AppRunner(self.side, access_log=None))
        for runner, port in zip(runners, (self.args.port, self.kv_port), strict=False):
            await runner.setup()
            await web.TCPSite(runner, self.args.host, port).start()
        self.log("serving", {"role": self.role, "port": self.args.port, "kvPort": self.kv_port,
                             "segment": self.kv.engine.segment, "model": self.model})
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        for runner in runners:
            await runner.cleanup()


def main() -> None:
    if any(os.environ.get(name) for name in RECORD_ENV):
        sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
        import recorder

        recorder.main()
        return
    args = _arguments(sys.argv[1:])
    if args.headless:
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
        return
    asyncio.run(Server(args).run())


if __name__ == "__main__":
    main()
