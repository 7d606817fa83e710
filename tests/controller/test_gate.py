"""The proxy's gate: prefill and decode of different KV layouts are never paired. The gate only
narrows the routable set, so only the membership ConfigMap differs from a full render: the proxy
Deployment stays as rendered (and up)."""

from __future__ import annotations

from controller_helpers import desired, pods_of, validated

from pd_operator.controller import gate
from pd_operator.proxy.membership import Membership
from pd_operator.render import render
from pd_operator.render.proxy import members


def _gate(v, pods):
    """(the manifests rendered with the gate's routable set, whether a layout rolls)."""
    routable, rolling = gate.routable(v.resolved, pods)
    return render(v.resolved, routable=routable), rolling


def _proxy(manifests):
    return next(m for m in manifests
                if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-proxy"))


def _routes(manifests) -> Membership:
    """What the gated proxy routes to (its membership ConfigMap)."""
    routes = members(next(m for m in manifests
                          if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-proxy")))
    assert routes is not None
    return routes


def _names(manifests, role: str) -> list[str]:
    return [u.name for u in _routes(manifests).role(role)]


def _gated_only_the_membership(v, out) -> None:
    """Everything but the membership ConfigMap is as rendered, the proxy Deployment included."""
    def others(manifests):
        return [m for m in manifests
                if not (m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-proxy"))]
    assert others(out) == others(render(v.resolved))
    assert _proxy(out)["spec"]["replicas"] == 1


def test_steady_state_leaves_the_proxy_as_rendered():
    v = validated(prefill__replicas=2)
    out, rolling = _gate(v, pods_of(desired(v)))
    assert not rolling and out == render(v.resolved)


def test_mid_roll_only_new_layout_instances_are_routed():
    v = validated(prefill__replicas=2)
    manifests = desired(v)
    pods = pods_of(manifests)
    for p in pods:  # prefill-1 still runs the old layout
        if p["metadata"]["name"].startswith("glm-flash-prefill-1"):
            p["metadata"]["labels"]["pd.serving.dev/kv-layout"] = "old"
    out, rolling = _gate(v, pods)
    assert rolling
    assert _names(out, "prefill") == ["glm-flash-prefill-0"]
    assert _routes(out).prefill[0].url == "http://glm-flash-prefill-0-0.glm-flash-prefill-0.default.svc:8000"
    assert _names(out, "decode") == ["glm-flash-decode-0"]
    _gated_only_the_membership(v, out)


def test_a_role_with_no_new_layout_instance_empties_that_role_and_keeps_the_proxy_up():
    v = validated()
    pods = pods_of(desired(v))
    for p in pods:
        if p["metadata"]["name"].startswith("glm-flash-decode"):
            p["metadata"]["labels"]["pd.serving.dev/kv-layout"] = "old"
    out, rolling = _gate(v, pods)
    assert rolling and _names(out, "decode") == [] and _names(out, "prefill") == ["glm-flash-prefill-0"]
    _gated_only_the_membership(v, out)


def test_new_layout_pods_that_are_not_ready_are_not_routed():
    v = validated(decode__replicas=2)
    pods = pods_of(desired(v))
    for p in pods:
        name = p["metadata"]["name"]
        if name.startswith("glm-flash-decode-1"):
            p["metadata"]["labels"]["pd.serving.dev/kv-layout"] = "old"
        if name.startswith("glm-flash-decode-0"):
            p["status"]["conditions"][0]["status"] = "False"
    out, _ = _gate(v, pods)
    assert _names(out, "decode") == []
    _gated_only_the_membership(v, out)
