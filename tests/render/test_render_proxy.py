"""The proxy as rendered: `pd-proxy` reading its upstreams from the ConfigMap `<name>-proxy`, so
an instance count (or a gate) changes the ConfigMap and never the Deployment's pod template."""

from __future__ import annotations

import json

from pd_operator.controller.permissions import RULES
from pd_operator.proxy.membership import KEY, document, parse_document
from pd_operator.render import proxy, render
from support.renders import VALID_EXAMPLES, of_kind, proxy_membership, role_of
from support.specs import example, resolve

GLM = next(p for p in VALID_EXAMPLES if p.stem == "glm-5.3-flash-tp8-dp2tp4")


def _scaled(prefill: int, decode: int) -> list[dict]:
    doc = example(GLM)
    doc["spec"]["prefill"]["replicas"], doc["spec"]["decode"]["replicas"] = prefill, decode
    return render(resolve(doc))


def _proxy_deployment(manifests: list[dict]) -> dict:
    (deployment,) = [m for m in of_kind(manifests, "Deployment") if role_of(m) == "proxy"]
    return deployment


def test_an_instance_count_changes_the_membership_and_not_the_proxy_deployment():
    one, three = _scaled(1, 1), _scaled(3, 3)
    assert _proxy_deployment(one) == _proxy_deployment(three)
    small, large = proxy_membership(one), proxy_membership(three)
    assert [u.name for u in small.decode] == ["glm-flash-decode-0"]
    assert [u.name for u in large.decode] == [f"glm-flash-decode-{i}" for i in range(3)]
    assert [u.name for u in large.prefill] == [f"glm-flash-prefill-{i}" for i in range(3)]
    assert large.decode[2].url == "http://glm-flash-decode-2-0.glm-flash-decode-2.default.svc:8000"
    assert small.version != large.version


def test_the_membership_config_map_lists_the_allowed_instances():
    ctx = resolve(example(GLM))
    every = proxy.membership_config_map(ctx)
    assert every == next(m for m in render(resolve(example(GLM))) if m["kind"] == "ConfigMap"
                         and m["metadata"]["name"] == "glm-flash-proxy")
    doc = json.loads(proxy.membership_config_map(ctx, {"prefill": {0: "old"}, "decode": {}})["data"][KEY])
    assert doc == document([proxy.upstream(ctx, "prefill", 0, "old")], [])
    assert parse_document(doc).decode == () and parse_document(doc).prefill[0].layout == "old"
    assert proxy.members(every) == parse_document(json.loads(every["data"][KEY]))
    assert proxy.members({"data": {KEY: "{"}}) is None


def test_the_proxy_stays_up_when_a_role_has_no_instance():
    zero = _scaled(1, 0)
    assert _proxy_deployment(zero)["spec"]["replicas"] == 1
    assert proxy_membership(zero).decode == ()
    # Readiness asks for members of both roles; liveness only that the process serves.
    cont = _proxy_deployment(zero)["spec"]["template"]["spec"]["containers"][0]
    assert cont["readinessProbe"]["httpGet"]["path"] == "/healthcheck"
    assert cont["livenessProbe"]["httpGet"]["path"] == "/pd/state"


def test_the_proxy_may_read_its_own_membership_config_map_and_nothing_else():
    manifests = render(resolve(example(GLM)))
    (account,) = of_kind(manifests, "ServiceAccount")
    (role,) = of_kind(manifests, "Role")
    (binding,) = of_kind(manifests, "RoleBinding")
    (config_map,) = [m for m in of_kind(manifests, "ConfigMap") if m["data"].keys() == {KEY}]
    name = config_map["metadata"]["name"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [name],
                              "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "default"}]
    pod = _proxy_deployment(manifests)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True
    argv = pod["containers"][0]["command"]
    assert argv[argv.index("--membership-configmap") + 1] == name
    # RBAC lets the operator create and bind the Role only while it holds what the Role grants.
    held = {(group, resource, verb) for rule in RULES if not rule.get("resourceNames")
            for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}
    assert granted <= held, granted - held
