"""The KV-link gate's probe port as a hostile neighbour would try it (issue 32): the operator now pushes
the membership there instead of the gate reading the API, so
- engine pods still mount no API token (no automounted token, no projected token volume) on every
  example, proxy or not;
- on a decode pod, the probe port admits no one from outside the deployment's engines but the
  operator's namespace: not a pod of the namespace, the proxy, another PDDeployment's pods, nor a
  pod labelled like the operator's in another namespace;
- whoever reaches the port (the deployment's own engines do) cannot point the gate anywhere but this
  deployment's prefill instances at their addresses: a push naming another deployment's instance, an
  address of its own choosing or a malformed document is refused and changes nothing.
Flows are checked with the pure evaluator (support/network_policy.py); the gate's push handler runs
as the rendered command configures it, without its serving loop.
"""

from __future__ import annotations

import copy
import json

import pytest

from pd_operator.proxy.membership import document
from pd_operator.render.command import CONFIG_DIR
from pd_operator.render.policy import OPERATOR_NAMESPACE
from pd_operator.render.proxy import every_instance, membership_document, upstream
from pd_operator.spec.ports import PROBE_PORT
from pd_operator.transfer.probe import parser
from pd_operator.transfer.probe_gate import Gate
from support.network_policy import Pod, allowed
from support.rendered_pods import component, stranger, validated_render, workload_pods
from support.renders import VALID_EXAMPLES, config_map_data, role_of, serving_sets
from support.specs import example

pytestmark = pytest.mark.security

NAMESPACES = {ns: {"kubernetes.io/metadata.name": ns} for ns in ("default", "elsewhere", OPERATOR_NAMESPACE)}
OPERATOR_LABELS = {"app.kubernetes.io/name": "pd-operator"}


def _variants():
    for path in VALID_EXAMPLES:
        doc = example(path)
        yield path.stem, doc
        off = copy.deepcopy(doc)
        off["spec"]["proxy"] = {"enabled": False}
        yield f"{path.stem}-no-proxy", off


@pytest.mark.parametrize(("name", "doc"), list(_variants()), ids=lambda v: v if isinstance(v, str) else "")
def test_engine_pods_mount_no_token_and_only_the_operators_namespace_reaches_the_gate(name, doc):
    _, manifests = validated_render(doc)
    for sts in serving_sets(manifests):
        pod = sts["spec"]["template"]["spec"]
        assert pod.get("automountServiceAccountToken") is False, sts["metadata"]["name"]
        projected = [s for v in pod.get("volumes", []) for s in (v.get("projected") or {}).get("sources", [])]
        assert not any("serviceAccountToken" in s for s in projected), sts["metadata"]["name"]
    pods = workload_pods(manifests)
    decode = next(p for p in pods.values() if component(p) == "decode")
    policies = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    admitted = {"the operator's pod": Pod("pd-operator-0", OPERATOR_NAMESPACE, OPERATOR_LABELS),
                "any pod of the operator's namespace": Pod("other", OPERATOR_NAMESPACE, {"app": "x"}),
                "own prefill": next(p for p in pods.values() if component(p) == "prefill")}
    refused = {"a pod labelled as the operator elsewhere": Pod("pd-operator-0", "elsewhere", OPERATOR_LABELS),
               "a plain pod of the namespace": Pod("client", decode.namespace, {"app": "client"}),
               "another PDDeployment's engine": stranger(decode, name="other-deployment"),
               **{f"own {component(p)}": p for p in pods.values() if component(p) == "proxy"}}
    for who, source in admitted.items():
        assert allowed(policies, source, decode, PROBE_PORT, namespaces=NAMESPACES), (name, who)
    for who, source in refused.items():
        assert not allowed(policies, source, decode, PROBE_PORT, namespaces=NAMESPACES), (name, who)


def _gate(tmp_path) -> tuple[Gate, object]:
    """The decode gate of the GLM example as its rendered command configures it (the serving
    ConfigMap's files at their mount), without its serving loop."""
    validation, manifests = validated_render(example())
    for key, text in config_map_data(manifests).items():
        (tmp_path / key).write_text(text)
    (sts,) = [s for s in serving_sets(manifests) if role_of(s) == "decode"]
    command = sts["spec"]["template"]["spec"]["containers"][1]["command"]
    args = parser().parse_args([a.replace(CONFIG_DIR, str(tmp_path)) for a in command[2:]])
    return Gate(args), validation.resolved


def test_a_push_can_name_only_this_deployments_instances_at_their_addresses(tmp_path):
    gate, resolved = _gate(tmp_path)
    good = membership_document(resolved)
    assert gate.push(json.dumps(good).encode())[0] == 200
    before = json.loads(gate.state())
    other = copy.deepcopy(example())
    other["metadata"]["name"] = "other-team"
    theirs, _ = validated_render(other)
    mine = upstream(resolved, "prefill", 0, resolved.layout_hash)
    elsewhere = document([type(mine)(mine.name, "http://203.0.113.7:8000", mine.layout)],
                         [upstream(resolved, "decode", 0, resolved.layout_hash)])
    for hostile, says in ((membership_document(theirs.resolved, every_instance(theirs.resolved)),
                           "is not an instance of prefill"),
                          (elsewhere, "serves at http://glm-flash-prefill-0-0"),
                          ({**good, "version": "000000000000"}, "version"),
                          (b"[" * 100_000, "nested too deeply"),
                          (b"\xff\xfe", "not a membership")):
        body = hostile if isinstance(hostile, bytes) else json.dumps(hostile).encode()
        status, answer = gate.push(body)
        assert status == 400 and says in json.loads(answer)["error"], (says, answer)
        assert json.loads(gate.state()) == before
