"""The proxy's gate: prefill and decode of different KV layouts are never paired. The gate only
narrows the routable set, so only the membership ConfigMap differs from a full render: the proxy
Deployment stays as rendered (and up)."""

from __future__ import annotations

from pd_operator.render import render
from support.controller_fakes import (
    desired,
    gated,
    gated_only_the_membership,
    pods_of,
    routed_names,
    validated,
)
from support.renders import proxy_membership


def test_steady_state_leaves_the_proxy_as_rendered():
    v = validated(prefill__replicas=2)
    out, rolling = gated(v, pods_of(desired(v)))
    assert not rolling and out == render(v.resolved)


def test_mid_roll_only_new_layout_instances_are_routed():
    v = validated(prefill__replicas=2)
    manifests = desired(v)
    pods = pods_of(manifests)
    for p in pods:  # prefill-1 still runs the old layout
        if p["metadata"]["name"].startswith("glm-flash-prefill-1"):
            p["metadata"]["labels"]["pd.serving.dev/kv-layout"] = "old"
    out, rolling = gated(v, pods)
    assert rolling
    assert routed_names(out, "prefill") == ["glm-flash-prefill-0"]
    assert proxy_membership(out).prefill[0].url == "http://glm-flash-prefill-0-0.glm-flash-prefill-0.default.svc:8000"
    assert routed_names(out, "decode") == ["glm-flash-decode-0"]
    gated_only_the_membership(v, out)


def test_a_role_with_no_new_layout_instance_empties_that_role_and_keeps_the_proxy_up():
    v = validated()
    pods = pods_of(desired(v))
    for p in pods:
        if p["metadata"]["name"].startswith("glm-flash-decode"):
            p["metadata"]["labels"]["pd.serving.dev/kv-layout"] = "old"
    out, rolling = gated(v, pods)
    assert rolling and routed_names(out, "decode") == []
    assert routed_names(out, "prefill") == ["glm-flash-prefill-0"]
    gated_only_the_membership(v, out)


def test_new_layout_pods_that_are_not_ready_are_not_routed():
    v = validated(decode__replicas=2)
    pods = pods_of(desired(v))
    for p in pods:
        name = p["metadata"]["name"]
        if name.startswith("glm-flash-decode-1"):
            p["metadata"]["labels"]["pd.serving.dev/kv-layout"] = "old"
        if name.startswith("glm-flash-decode-0"):
            p["status"]["conditions"][0]["status"] = "False"
    out, _ = gated(v, pods)
    assert routed_names(out, "decode") == []
    gated_only_the_membership(v, out)
