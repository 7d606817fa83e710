"""Prefix routing as rendered, for every example. Block boundaries for each resolved layout, prefix
caching off and on: the membership gives each prefill the block its engine is rendered with
(`--block-size`), and only when that engine caches prefixes (`--enable-prefix-caching`); the proxy cuts
prompts there. Precise mode: the prefill engines' `--kv-events-config`, their ports, the membership's
publishers and the NetworkPolicy rule admitting only the proxy pods to them. Pure."""

from __future__ import annotations

import copy
import json

import pytest

from pd_operator.proxy.membership import parse_document
from pd_operator.proxy.prefix_index import block_keys
from pd_operator.proxy.prefix_routing import Prompt
from pd_operator.proxy.prompt_tokens import PromptTokens
from pd_operator.render import render
from pd_operator.render.policy import proxies_of
from pd_operator.render.proxy import Prefix, membership_document, recorded_prefix, spec_prefix
from support.renders import VALID_EXAMPLES, proxy_membership, serving_argv, serving_sets
from support.specs import example, resolve


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize("caching", [False, True], ids=["caching-off", "caching-on"])
@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_prefill_blocks_are_the_engines_own(path, caching):
    doc = copy.deepcopy(example(path))
    doc["spec"]["prefill"]["enablePrefixCaching"] = caching
    ctx = resolve(doc)
    manifests = render(ctx)
    first = ctx.names.instance("prefill", 0)
    (engine,) = [s for s in serving_sets(manifests) if s["metadata"]["name"] == first]
    argv = serving_argv(engine)
    block = int(flag(argv, "--block-size") or 0)
    assert block == ctx.engine_block_size("prefill")
    assert ("--enable-prefix-caching" in argv) is caching
    members = proxy_membership(manifests).prefill
    assert members
    for member in members:
        assert member.block_tokens == (block if caching else None)
    if caching:
        # A prompt of 2.5 blocks has 2 keys, cut at the engine's boundaries.
        tokens = tuple(range(block * 5 // 2))
        keys = Prompt(PromptTokens(tokens)).keys(block)
        assert keys == block_keys(tokens, block) and len(keys) == 2
        assert keys[0] == block_keys(tokens[:block], block)[0]


def precise(path, port: int = 6100) -> tuple:
    doc = copy.deepcopy(example(path))
    doc["spec"]["prefill"]["enablePrefixCaching"] = True
    doc["spec"].setdefault("proxy", {})["routing"] = {"prefix": "precise", "kvEventsPort": port}
    ctx = resolve(doc)
    return ctx, render(ctx)


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_precise_routing_renders_publishers_their_ports_and_who_may_read_them(path):
    ctx, manifests = precise(path)
    plan = ctx.shapes["prefill"]
    ranks = range(6100, 6100 + plan.dp)
    for sts in serving_sets(manifests):
        role = sts["metadata"]["labels"]["pd.serving.dev/role"]
        argv = serving_argv(sts)
        ports = {p["containerPort"] for p in sts["spec"]["template"]["spec"]["containers"][0]["ports"]}
        if role == "decode":
            assert "--kv-events-config" not in argv and not ports & set(ranks)
            continue
        assert json.loads(flag(argv, "--kv-events-config") or "") == {
            "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:6100"}
        assert set(ranks) <= ports  # the pods of the instance, each binding its own ranks' ports
    # The proxy learns each prefill's publishers from the membership: rank r on the pod running it.
    for i, member in enumerate(proxy_membership(manifests).prefill):
        hosts = [ctx.names.pod_host("prefill", i, r // plan.dp_local) for r in range(plan.dp)]
        assert member.events == tuple(f"tcp://{host}:{6100 + r}" for r, host in enumerate(hosts))
    # Only this deployment's proxy pods reach those ports: the events carry every prompt's token ids.
    (policy,) = [m for m in manifests if m["kind"] == "NetworkPolicy"
                 and m["metadata"]["name"] == ctx.names.network_policy]
    rules = [r for r in policy["spec"]["ingress"]
             if any(p["port"] == 6100 for p in r.get("ports", []))]
    assert rules == [{"from": [proxies_of(ctx)],
                      "ports": [{"protocol": "TCP", "port": 6100,
                                 **({"endPort": 6100 + plan.dp - 1} if plan.dp > 1 else {})}]}]
    proxy = next(m for m in manifests if m["kind"] == "Deployment")
    command = proxy["spec"]["template"]["spec"]["containers"][0]["command"]
    assert flag(command, "--prefix-routing") == "precise"


@pytest.mark.parametrize("mode", ["off", "approximate"])
def test_no_events_without_precise_routing(mode):
    doc = copy.deepcopy(example(VALID_EXAMPLES[0]))
    doc["spec"]["prefill"]["enablePrefixCaching"] = True
    doc["spec"].setdefault("proxy", {})["routing"] = {"prefix": mode}
    ctx = resolve(doc)
    manifests = render(ctx)
    assert not any("--kv-events-config" in serving_argv(s) for s in serving_sets(manifests))
    assert all(not m.events for m in proxy_membership(manifests).prefill)
    (policy,) = [m for m in manifests if m["kind"] == "NetworkPolicy"
                 and m["metadata"]["name"] == ctx.names.network_policy]
    assert not any(p["port"] == 5557 for r in policy["spec"]["ingress"] for p in r.get("ports", []))


# -- an instance on another revision: what its own engines run (render/proxy.py recorded_prefix) ----------

@pytest.mark.parametrize("caching,mode", [(False, "approximate"), (True, "approximate"), (True, "precise")],
                         ids=["caching-off", "caching-on", "precise"])
@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_a_recorded_stateful_set_reads_back_as_the_prefix_routing_it_was_rendered_for(path, caching, mode):
    """What the controller reads of an old revision's recorded StatefulSet is what that revision's
    spec resolves: its block with prefix caching on (none off), its publishers in precise mode
    (which needs prefill caching prefixes)."""
    doc = copy.deepcopy(example(path))
    doc["spec"]["prefill"]["enablePrefixCaching"] = caching
    doc["spec"].setdefault("proxy", {})["routing"] = {"prefix": mode}
    ctx = resolve(doc)
    sets = {s["metadata"]["name"]: s for s in serving_sets(render(ctx))}
    for i in range(ctx.role("prefill").replicas):
        read = recorded_prefix(ctx, i, sets[ctx.names.instance("prefill", i)])
        assert read == spec_prefix(ctx, i)
        assert (read is not None) is caching and (caching is False or read.block_tokens > 0)
        assert bool(read and read.events) is (mode == "precise")


def _engine(argv: list[str]) -> dict:
    prelude = ["python3", "/pd-tools/pd-preflight", "--config", "/etc/pd/preflight-prefill.json", "--"]
    return {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "command": prelude + argv}]}}}}


SERVE = ["vllm", "serve", "m", "--data-parallel-size", "2", "--block-size", "128"]


@pytest.mark.parametrize("argv,want", [
    (SERVE, 128),  # vLLM's default: prefix caching on
    ([*SERVE, "--no-enable-prefix-caching"], None),
    ([*SERVE, "--no-enable-prefix-caching", "--enable-prefix-caching"], 128),  # the last one holds
    ([*SERVE, "--enable-prefix-caching", "--no-enable-prefix-caching"], None),
    ([*SERVE, "--no-enable-prefix"], None),  # an abbreviation: not read, so not known
    ([*SERVE[:-2]], None),  # no block size said
    ([*SERVE[:-1], "many"], None),
    (["sleep", "infinity"], None),  # not a vllm serve this operator rendered
], ids=["default-on", "off", "last-on", "last-off", "abbreviated", "no-block", "bad-block", "not-vllm"])
def test_a_recorded_engine_gives_a_block_only_when_its_argv_says_it_for_certain(argv, want):
    ctx = resolve(example(VALID_EXAMPLES[0]))
    read = recorded_prefix(ctx, 0, _engine(argv))
    assert (read.block_tokens if read else None) == want


def test_the_membership_lists_an_old_revision_s_prefill_with_its_own_prefix_routing_or_by_load():
    doc = copy.deepcopy(example(VALID_EXAMPLES[0]))
    doc["spec"]["prefill"]["enablePrefixCaching"] = True
    doc["spec"].setdefault("proxy", {})["routing"] = {"prefix": "approximate", "prefillCacheBlocks": 4096}
    ctx = resolve(doc)
    routable = {"prefill": {0: "old", 1: "other", 2: ctx.layout_hash, 3: ctx.layout_hash}, "decode": {}}
    own = {0: Prefix(16), 1: None, 3: Prefix(ctx.prefix_hit_tokens("prefill"))}
    members = parse_document(membership_document(ctx, routable, own)).prefill
    # Its own block; prefillCacheBlocks counts the blocks of engines of the spec's layout: on another
    # layout the proxy's default, on the spec's (an old revision of an env change) the spec's bound.
    assert [(u.layout, u.block_tokens, u.cache_blocks) for u in members] == [
        ("old", 16, None), ("other", None, None),
        (ctx.layout_hash, ctx.prefix_hit_tokens("prefill"), 4096),
        (ctx.layout_hash, ctx.prefix_hit_tokens("prefill"), 4096)]
