"""The routing proxy's membership file and its state answer: one home for both formats. Pure.

Why a file: the operator writes `document(...)` into the ConfigMap `<name>-proxy` under `KEY`; the
kubelet projects it into every proxy pod at `MOUNT_DIR` and `pd-proxy` re-reads it, so a scale
event or a gate changes one ConfigMap and restarts nothing that carries requests. `version` names
the content, so the operator can tell from `STATE_PATH` (what each proxy pod answers there: the
version it routes by, and per upstream what it still carries) when a pod follows a new document
and when a departed instance no longer serves anything.

Whoever can write the ConfigMap decides where the proxy sends every prompt and its engines' API key,
so a proxy started with its deployment's identity (InstanceAddresses) accepts an entry only at the
address the operator renders for that instance (instance_url): its leader pod's name under its
headless Service in the proxy's namespace, on the serving port. A document with any other entry is
malformed as a whole, and the proxy keeps the membership it had.

Each upstream carries the kv-layout hash its pods run (spec/layout.py): during a rollout that
changes the layout, old and new instances are members at once, and the proxy pairs a prefill only
with a decode of the same layout (balancer.py). Optional `pairs` (layout -> layout) says which
layouts pair as another: after a decode-only block-size change prefill keeps its revision and its
layout's hash while decode's new engines carry the spec's (render/workloads.py with_running), and
they pair (vllm-ascend PR #16755 moves KV between unequal blocks). It stays out of `version`, which
names the members, so a reader that does not know it (an older proxy or gate) still reads the
document, and pairs only equal layouts.

Prefix routing (proxy/prefix_routing.py) reads three more fields of a prefill entry, each optional:
`blockTokens`, the tokens of one prefix-cache block as that member's engines run (the engine block the
operator resolved: spec/validate.py `Resolved.prefix_hit_tokens`; for a member still on an older
revision during a rollout, the block that revision's engines were rendered with, read from its
revision record: render/proxy.py recorded_prefix; absent when its engines do not cache prefixes or
that cannot be known, and the member is then chosen by load alone: the proxy never guesses a block);
`cacheBlocks`, how many such blocks its KV cache holds (spec.proxy.routing.prefillCacheBlocks, for
members on the spec's KV layout only; the approximate mode's bound); and `events`, the vLLM KV-events
publishers of its DP ranks in rank order (`tcp://<pod host>:<port>`, precise mode), each at one of
that instance's pods, as its own revision runs them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pd_operator.api.types import ROLES
from pd_operator.names import Names

KEY = "upstreams.json"
"""The ConfigMap key (and so the file name under MOUNT_DIR)."""
MOUNT_DIR = "/etc/pd-proxy"
STATE_PATH = "/pd/state"
VERSION_CHARS = 12


@dataclass(frozen=True)
class Upstream:
    name: str
    """The instance name, e.g. `glm-flash-decode-1` (its StatefulSet)."""
    url: str
    """`http://<leader pod DNS>:<serving port>`."""
    layout: str = ""
    """The kv-layout hash of its pods; prefill and decode pair only when equal (empty pairs with empty:
    a document without layouts)."""
    block_tokens: int | None = None
    """Tokens per prefix-cache block on its layout (None: route it by load alone)."""
    cache_blocks: int | None = None
    """Prefix-cache blocks its KV cache holds (None: the proxy's default bound)."""
    events: tuple[str, ...] = ()
    """Its DP ranks' KV-events publishers, `tcp://host:port`, in rank order."""


def _entry(u: Upstream) -> dict[str, Any]:
    out: dict[str, Any] = {"name": u.name, "url": u.url.rstrip("/")}
    if u.layout:
        out["layout"] = u.layout
    if u.block_tokens is not None:
        out["blockTokens"] = u.block_tokens
    if u.cache_blocks is not None:
        out["cacheBlocks"] = u.cache_blocks
    if u.events:
        out["events"] = list(u.events)
    return out


def _entries(upstreams: list[Upstream]) -> list[dict[str, Any]]:
    return [_entry(u) for u in sorted(upstreams, key=lambda u: u.name)]


def _version(lists: dict[str, list[dict[str, Any]]]) -> str:
    text = json.dumps(lists, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:VERSION_CHARS]


def document(prefill: list[Upstream], decode: list[Upstream], pairs: Mapping[str, str] | None = None) -> dict:
    """The membership document: deterministic (entries sorted by name), versioned by its members."""
    lists = {"prefill": _entries(prefill), "decode": _entries(decode)}
    return {"version": _version(lists), **lists, **({"pairs": dict(sorted(pairs.items()))} if pairs else {})}


def paired_as(pairs: Mapping[str, str], layout: str) -> str:
    """The kv-layout `layout` pairs as under `pairs` (the document's `pairs`, render/workloads.py
    Templates.pairs): instances pair when theirs are equal."""
    return pairs.get(layout, layout)


@dataclass(frozen=True)
class Membership:
    """A parsed membership document."""

    version: str
    prefill: tuple[Upstream, ...]
    decode: tuple[Upstream, ...]
    pairs: Mapping[str, str] = field(default_factory=dict)
    """Layouts that pair as another (module doc)."""

    def role(self, role: str) -> tuple[Upstream, ...]:
        return self.prefill if role == "prefill" else self.decode

    def paired(self, layout: str) -> str:
        """The layout `layout` pairs as (paired_as)."""
        return paired_as(self.pairs, layout)

    def pairable(self, role: str, layout: str | None = None) -> tuple[Upstream, ...]:
        """Members of `role` with a member of the other role on their KV layout (and on `layout`
        when given): the only ones a request may use."""
        other = {self.paired(u.layout) for u in self.role("decode" if role == "prefill" else "prefill")}
        wanted = None if layout is None else self.paired(layout)
        return tuple(u for u in self.role(role)
                     if (paired := self.paired(u.layout)) in other and (wanted is None or paired == wanted))

    def names(self) -> dict[str, str]:
        """Member name -> its role."""
        return {u.name: role for role in ROLES for u in self.role(role)}


def instance_url(names: Names, role: str, index: int, port: int) -> str:
    """Where an instance serves: its leader pod's stable DNS name (Names.pod_host) and the serving port."""
    return f"http://{names.pod_host(role, index, 0)}:{port}"


@dataclass(frozen=True)
class InstanceAddresses:
    """The upstreams one deployment's proxy may route to: instance_url of its own instances."""

    names: Names
    port: int

    def check(self, role: str, upstream: Upstream, path: str) -> None:
        """ValueError when `upstream` is not one of this deployment's `role` instances at its address."""
        prefix = f"{self.names.deployment}-{role}-"
        index = upstream.name.removeprefix(prefix)
        if upstream.name == index or not re.fullmatch(r"0|[1-9][0-9]{0,5}", index):
            raise ValueError(f"{path}.name: {upstream.name!r} is not an instance of {role} ({prefix}<n>)")
        want = instance_url(self.names, role, int(index), self.port)
        if upstream.url != want:
            raise ValueError(f"{path}.url: {upstream.name} serves at {want}, not {upstream.url!r}")
        for i, endpoint in enumerate(upstream.events):
            if not self._at_pod(role, int(index), urlsplit(endpoint).hostname or ""):
                raise ValueError(f"{path}.events[{i}]: {endpoint!r} is not at a pod of {upstream.name}")

    def _at_pod(self, role: str, index: int, host: str) -> bool:
        """Whether `host` is the DNS name (Names.pod_host) of one of the pods of instance `index`."""
        ordinal = host.split(".", 1)[0].removeprefix(f"{self.names.instance(role, index)}-")
        return (re.fullmatch(r"0|[1-9][0-9]{0,3}", ordinal) is not None
                and host == self.names.pod_host(role, index, int(ordinal)))


def _upstream(obj: Any, path: str) -> Upstream:
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: an object with name and url, not {type(obj).__name__}")
    name, url = obj.get("name"), obj.get("url")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{path}.name: a non-empty string, not {name!r}")
    if not isinstance(url, str) or not _http(url):
        raise ValueError(f"{path}.url: an http(s)://host:port URL, not {url!r}")
    layout = obj.get("layout", "")
    if not isinstance(layout, str):
        raise ValueError(f"{path}.layout: a string, not {layout!r}")
    events = obj.get("events", [])
    if not isinstance(events, list) or not all(isinstance(e, str) and _tcp(e) for e in events):
        raise ValueError(f"{path}.events: a list of tcp://host:port endpoints, not {events!r}")
    return Upstream(name, url.rstrip("/"), layout, _positive(obj, "blockTokens", path),
                    _positive(obj, "cacheBlocks", path), tuple(events))


def _positive(obj: dict, key: str, path: str) -> int | None:
    value = obj.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{path}.{key}: a count (int >= 1), not {value!r}")
    return value


def _tcp(endpoint: str) -> bool:
    parts = urlsplit(endpoint)
    try:
        return parts.scheme == "tcp" and bool(parts.hostname) and parts.port is not None
    except ValueError:  # a port out of range
        return False


def _http(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def parse_text(data: bytes | str, addresses: InstanceAddresses | None = None) -> Membership:
    """parse_document of a JSON text; ValueError for anything that is not a good document (nesting
    too deep for the parser included)."""
    try:
        obj = json.loads(data)
    except RecursionError:
        raise ValueError("the document is JSON nested too deeply") from None
    return parse_document(obj, addresses)


def parse_document(obj: Any, addresses: InstanceAddresses | None = None) -> Membership:
    """The membership a document describes; ValueError naming the field when it is malformed
    (unknown keys are ignored, so an older proxy reads a newer document) or, with `addresses`,
    lists an upstream that is not one of the deployment's instances at its address."""
    if not isinstance(obj, dict):
        raise ValueError(f"the document is an object, not {type(obj).__name__}")
    roles: dict[str, tuple[Upstream, ...]] = {}
    for role in ROLES:
        items = obj.get(role)
        if not isinstance(items, list):
            raise ValueError(f"{role}: a list of upstreams, not {items!r}")
        roles[role] = tuple(_upstream(item, f"{role}[{i}]") for i, item in enumerate(items))
        if addresses is not None:
            for i, upstream in enumerate(roles[role]):
                addresses.check(role, upstream, f"{role}[{i}]")
    names = [u.name for role in ROLES for u in roles[role]]
    if duplicated := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"upstream names appear more than once: {', '.join(duplicated)}")
    version = obj.get("version")
    want = document(list(roles["prefill"]), list(roles["decode"]))["version"]
    if version != want:
        raise ValueError(f"version: {version!r} is not the content's ({want}): a partial or hand-edited file")
    pairs = obj.get("pairs", {})
    if not isinstance(pairs, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in pairs.items()):
        raise ValueError(f"pairs: an object of kv-layout hashes by kv-layout hash, not {pairs!r}")
    return Membership(want, roles["prefill"], roles["decode"], pairs)


@dataclass(frozen=True)
class UpstreamLoad:
    role: str
    inflight: int
    """Requests that upstream is serving now (prefill: the prefill call runs; decode: the decode
    call runs or streams)."""
    awaiting_decode: int
    """Prefill only: requests whose prefill finished there and whose decode has not yet sent its
    first byte (decode pulls the KV before its first token; until then the blocks are needed)."""
    member: bool = True
    """Listed by the membership the proxy routes by (false: a former member still carrying requests;
    an answer without the field reads as a member, which only holds a drain longer)."""


@dataclass(frozen=True)
class ProxyState:
    version: str | None
    """The membership version the proxy routes by (None: it has loaded none)."""
    upstreams: dict[str, UpstreamLoad]
    """Every member, and every former member that still carries requests, by instance name: an
    instance absent from it is neither routed to nor carrying anything through this proxy."""


def state_document(state: ProxyState) -> dict:
    """The proxy's answer at STATE_PATH."""
    return {"version": state.version,
            "upstreams": {name: {"role": load.role, "inflight": load.inflight,
                                 "awaitingDecode": load.awaiting_decode, "member": load.member}
                          for name, load in sorted(state.upstreams.items())}}


def _count(obj: dict, key: str, path: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{path}.{key}: a count (int >= 0), not {value!r}")
    return value


def parse_state(obj: Any) -> ProxyState:
    """A proxy's STATE_PATH answer; ValueError naming the field when it is malformed."""
    if not isinstance(obj, dict):
        raise ValueError(f"the state is an object, not {type(obj).__name__}")
    version = obj.get("version")
    if version is not None and not isinstance(version, str):
        raise ValueError(f"version: a string or null, not {version!r}")
    upstreams = obj.get("upstreams")
    if not isinstance(upstreams, dict):
        raise ValueError(f"upstreams: an object by instance name, not {upstreams!r}")
    out: dict[str, UpstreamLoad] = {}
    for name, load in upstreams.items():
        path = f"upstreams.{name}"
        if not isinstance(load, dict):
            raise ValueError(f"{path}: an object, not {load!r}")
        role = load.get("role")
        if role not in ROLES:
            raise ValueError(f"{path}.role: one of {', '.join(ROLES)}, not {role!r}")
        member = load.get("member", True)
        if not isinstance(member, bool):
            raise ValueError(f"{path}.member: true or false, not {member!r}")
        out[name] = UpstreamLoad(role, _count(load, "inflight", path), _count(load, "awaitingDecode", path),
                                 member)
    return ProxyState(version, out)
