"""The proxy's gate: only instances that can serve are listed, each with the KV layout its pods run,
and the proxy pairs prefill and decode of one layout only. The gate only narrows the routable set, so
only the membership ConfigMap differs from a full render: the proxy Deployment stays as rendered
(and up)."""

from __future__ import annotations

from pd_operator.render import render
from support.controller_fakes import (
    desired,
    gated,
    gated_only_the_membership,
    pods_of,
    routable_of,
    routed_names,
    validated,
)
from support.renders import proxy_membership


def _pairable(manifests, role: str) -> list[str]:
    return [u.name for u in proxy_membership(manifests).pairable(role)]


def _relabel(pods, prefix: str, layout: str) -> None:
    for p in pods:
        if p["metadata"]["name"].startswith(prefix):
            p["metadata"]["labels"]["pd.serving.dev/kv-layout"] = layout


def test_steady_state_leaves_the_proxy_as_rendered():
    v = validated(prefill__replicas=2)
    assert gated(v, pods_of(desired(v))) == render(v.resolved)


def test_mid_roll_each_instance_is_listed_with_its_layout_and_pairs_only_within_it():
    v = validated(prefill__replicas=2, decode__replicas=2)
    pods = pods_of(desired(v))
    _relabel(pods, "glm-flash-prefill-1", "old")  # prefill-1 and decode-1 still run the old layout
    _relabel(pods, "glm-flash-decode-1", "old")
    out = gated(v, pods)
    routes = proxy_membership(out)
    assert {u.name: u.layout for u in routes.prefill} == {"glm-flash-prefill-0": v.resolved.layout_hash,
                                                          "glm-flash-prefill-1": "old"}
    assert routes.pairable("prefill", "old") == (routes.prefill[1],)
    assert routes.pairable("decode", "old") == (routes.decode[1],)
    assert routes.pairable("decode", v.resolved.layout_hash) == (routes.decode[0],)
    assert routes.prefill[0].url == "http://glm-flash-prefill-0-0.glm-flash-prefill-0.default.svc:8000"
    gated_only_the_membership(v, out)


def test_a_layout_without_a_partner_pairs_nothing_and_keeps_the_proxy_up():
    v = validated()
    pods = pods_of(desired(v))
    _relabel(pods, "glm-flash-decode", "old")
    out = gated(v, pods)
    assert routed_names(out, "decode") == ["glm-flash-decode-0"]
    assert routed_names(out, "prefill") == ["glm-flash-prefill-0"]
    assert _pairable(out, "prefill") == [] and _pairable(out, "decode") == []
    gated_only_the_membership(v, out)


def test_pods_that_are_not_ready_or_of_two_layouts_are_not_routed():
    v = validated(decode__replicas=2, decode__npusPerNode=4)  # two pods per decode instance
    pods = pods_of(desired(v))
    for p in pods:
        name = p["metadata"]["name"]
        if name.startswith("glm-flash-decode-1-1"):  # one rank replaced, the other not yet
            p["metadata"]["labels"] = {**p["metadata"]["labels"], "pd.serving.dev/kv-layout": "old"}
        if name.startswith("glm-flash-decode-0"):
            p["status"]["conditions"][0]["status"] = "False"
    out = gated(v, pods)
    assert routed_names(out, "decode") == []
    gated_only_the_membership(v, out)


def test_an_instance_the_rollout_takes_out_leaves_the_membership():
    v = validated(decode__replicas=2)
    pods = pods_of(desired(v))
    _relabel(pods, "glm-flash-decode-1", "old")
    for p in pods:  # decode-1 runs an old template
        if p["metadata"]["name"].startswith("glm-flash-decode-1"):
            p["metadata"]["labels"]["pd.serving.dev/revision"] = "old"
    routable, step = routable_of(v, pods, ("glm-flash-decode-1",))
    assert step.leave == frozenset({("decode", 1)})
    assert routable["decode"] == {0: v.resolved.layout_hash}
