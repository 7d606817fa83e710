"""The KV-link gate as the operator sees it: decode instances leave the proxy when their kv-link
container is not ready, DecodeReady says why, and status.kvLinks carries each pair's state with the
figures of the gate round that changed it (read only on a change)."""

from __future__ import annotations

from pd_operator.controller.links import link_status
from pd_operator.render import render
from support.controller_fakes import (
    desired,
    gated,
    gated_only_the_membership,
    link_down,
    pods_of,
    routed_names,
    validated,
)
from support.renders import proxy_membership


def _round(ok: bool, *prefills: int) -> dict:
    """A gate round as `pd-kv-probe gate` serves it in its state (transfer/gate_state.py)."""
    return {"ok": ok, "errors": [], "at": 0.0, "peers": [
        {"peer": f"glm-flash-prefill-{p}-0.glm-flash-prefill-{p}.default.svc:8090", "ok": ok,
         "latencyMs": 2.5 + p, "gbps": 1.5, "bytes": 1, "entries": 1,
         "errors": [] if ok else ["cannot fetch the descriptor"]} for p in prefills]}


def _decode_down(pods: list[dict], *indices: int) -> list[dict]:
    names = {f"glm-flash-decode-{i}-" for i in indices}
    return [link_down(p) if any(p["metadata"]["name"].startswith(n) for n in names) else p for p in pods]


def test_a_decode_instance_without_a_link_leaves_the_proxy():
    v = validated(decode__replicas=2)
    pods = _decode_down(pods_of(desired(v)), 1)
    out = gated(v, pods)
    assert routed_names(out, "decode") == ["glm-flash-decode-0"]
    assert proxy_membership(out).decode[0].url == "http://glm-flash-decode-0-0.glm-flash-decode-0.default.svc:8000"
    assert routed_names(out, "prefill") == ["glm-flash-prefill-0"]  # prefill is not gated by decode links
    gated_only_the_membership(v, out)


def test_no_linked_decode_instance_empties_decode_and_a_working_one_brings_it_back():
    v = validated()
    pods = pods_of(desired(v))
    out = gated(v, _decode_down(pods, 0))
    assert routed_names(out, "decode") == []
    gated_only_the_membership(v, out)
    out = gated(v, pods)
    assert out == render(v.resolved)


def test_a_decode_pod_not_created_yet_is_not_routed_to():
    v = validated()
    pods = [p for p in pods_of(desired(v)) if "decode" not in p["metadata"]["name"]]
    assert routed_names(gated(v, pods), "decode") == []


def test_link_status_reads_the_figures_only_when_a_link_changes():
    v = validated(prefill__replicas=2)
    dep, pods = v.resolved, pods_of(desired(v))
    reads: list[str] = []

    def read(pod: str) -> dict:
        reads.append(pod)
        return _round(True, 0, 1)

    first = link_status(dep, pods, [], read)
    assert reads == ["glm-flash-decode-0-0"]
    assert first == [{"decode": "glm-flash-decode-0", "prefill": f"glm-flash-prefill-{p}", "linked": True,
                      "latencyMs": 2.5 + p, "gbps": 1.5} for p in (0, 1)]
    assert link_status(dep, pods, first, read) == first and len(reads) == 1  # steady: nothing read

    def broken(pod: str) -> dict:
        reads.append(pod)
        return _round(False, 0, 1)

    down = link_status(dep, _decode_down(pods, 0), first, broken)
    assert len(reads) == 2 and [e["linked"] for e in down] == [False, False]
    assert down[0]["message"] == "cannot fetch the descriptor"


def test_link_status_without_figures_still_gives_the_state():
    v = validated()
    entries = link_status(v.resolved, _decode_down(pods_of(desired(v)), 0), [], lambda pod: None)
    assert entries == [{"decode": "glm-flash-decode-0", "prefill": "glm-flash-prefill-0", "linked": False}]
