"""The proxy's rollout gate: prefill and decode of different KV layouts are never paired."""

from __future__ import annotations

from controller_helpers import desired, pods_of, validated

from pd_operator.controller.rollout import gate
from pd_operator.controller.status import layout_hash
from pd_operator.names import Names
from pd_operator.render import render


def _gate(v, pods):
    dep = v.deployment
    return gate(render(v), pods, Names(dep.name, dep.namespace),
                {r: v.pod_plans[r].pods for r in ("prefill", "decode")},
                {r: dep.role(r).replicas for r in ("prefill", "decode")}, layout_hash(v))


def _proxy(manifests):
    return next(m for m in manifests
                if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-proxy"))


def _hosts(proxy, flag):
    argv = proxy["spec"]["template"]["spec"]["containers"][0]["command"]
    start = argv.index(flag) + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return argv[start:end]


def test_steady_state_leaves_the_proxy_as_rendered():
    v = validated(prefill__replicas=2)
    out, rolling = _gate(v, pods_of(desired(v)))
    assert not rolling and out == render(v)


def test_mid_roll_only_new_layout_instances_are_routed():
    v = validated(prefill__replicas=2)
    manifests = desired(v)
    pods = pods_of(manifests)
    for p in pods:  # prefill-1 still runs the old layout
        if p["metadata"]["name"].startswith("glm-flash-prefill-1"):
            p["metadata"]["labels"]["pd.serving.dev/kv-layout"] = "old"
    out, rolling = _gate(v, pods)
    proxy = _proxy(out)
    assert rolling
    assert _hosts(proxy, "--prefiller-hosts") == ["glm-flash-prefill-0-0.glm-flash-prefill-0.default.svc"]
    assert _hosts(proxy, "--prefiller-ports") == ["8000"]
    assert _hosts(proxy, "--decoder-hosts") == ["glm-flash-decode-0-0.glm-flash-decode-0.default.svc"]
    assert [m for m in out if m is not proxy] == [m for m in render(v) if m["kind"] != "Deployment"
                                                 or not m["metadata"]["name"].endswith("-proxy")]


def test_a_role_with_no_new_layout_instance_scales_the_proxy_to_zero():
    v = validated()
    pods = pods_of(desired(v))
    for p in pods:
        if p["metadata"]["name"].startswith("glm-flash-decode"):
            p["metadata"]["labels"]["pd.serving.dev/kv-layout"] = "old"
    out, rolling = _gate(v, pods)
    assert rolling and _proxy(out)["spec"]["replicas"] == 0


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
    assert _proxy(out)["spec"]["replicas"] == 0
