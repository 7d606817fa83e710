"""Gang scheduling and network placement as rendered (render/scheduling.py): the PodGroups, the pod
fields that tie pods to them, the affinity terms and how they combine with the user's. Pure."""

from __future__ import annotations

import copy

import pytest

from pd_operator.api.labels import DEPLOYMENT, HOSTNAME, INSTANCE, ROLE, VOLCANO_GROUP
from pd_operator.render import render, scheduling
from pd_operator.render.runnable import validate
from support.renders import VALID_EXAMPLES, of_kind, serving_sets
from support.specs import example

GLM = next(p for p in VALID_EXAMPLES if p.stem == "glm-5.3-flash-tp8-dp2tp4")
DOMAIN = "example.com/super-pod"
NPU = "huawei.com/Ascend910"


def multi_pod(gang: str = "none", **placement) -> dict:
    """GLM with 2 prefill instances of 1 pod and 2 decode instances of 2 pods (DP4 x TP4 = 16 NPUs
    on nodes of 8)."""
    doc = example(GLM)
    doc["spec"]["prefill"]["replicas"] = 2
    doc["spec"]["decode"].update(replicas=2, dataParallelSize=4)
    doc["spec"]["scheduling"] = {"gang": gang}
    if placement:
        doc["spec"]["placement"] = placement
    return doc


def rendered(doc: dict) -> list[dict]:
    validation = validate(doc)
    assert validation.ok, [f.line() for f in validation.errors]
    return render(validation.resolved)


def statefulset(manifests: list[dict], name: str) -> dict:
    return next(s for s in serving_sets(manifests) if s["metadata"]["name"] == name)


def pod_spec(manifests: list[dict], name: str) -> dict:
    return dict(statefulset(manifests, name)["spec"]["template"]["spec"])


def test_no_gang_and_no_placement_render_nothing_new():
    manifests = rendered(multi_pod())
    assert not of_kind(manifests, "PodGroup")
    spec = pod_spec(manifests, "glm-flash-decode-0")
    assert not {"schedulerName", "schedulingGroup", "priorityClassName"} & set(spec)
    # Only the node-per-pod anti-affinity of a multi-pod instance.
    assert spec["affinity"] == {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {DEPLOYMENT: "glm-flash", ROLE: "decode", INSTANCE: "0"}},
         "topologyKey": HOSTNAME}]}}
    assert "affinity" not in pod_spec(manifests, "glm-flash-prefill-0")


def test_volcano_renders_one_podgroup_per_instance_with_its_pods_and_npus():
    doc = multi_pod("volcano")
    doc["spec"]["scheduling"] |= {"queue": "inference", "priorityClassName": "serving-high"}
    manifests = rendered(doc)
    groups = {g["metadata"]["name"]: g for g in of_kind(manifests, "PodGroup")}
    assert set(groups) == {"glm-flash-prefill-0", "glm-flash-prefill-1", "glm-flash-decode-0",
                           "glm-flash-decode-1"}
    decode = groups["glm-flash-decode-1"]
    assert decode["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert decode["spec"] == {"minMember": 2, "minResources": {NPU: 16}, "queue": "inference",
                              "priorityClassName": "serving-high"}
    assert groups["glm-flash-prefill-0"]["spec"]["minMember"] == 1
    assert groups["glm-flash-prefill-0"]["spec"]["minResources"] == {NPU: 8}
    labels = decode["metadata"]["labels"]
    assert (labels[DEPLOYMENT], labels[ROLE], labels[INSTANCE]) == ("glm-flash", "decode", "1")
    template = statefulset(manifests, "glm-flash-decode-1")["spec"]["template"]
    assert template["metadata"]["annotations"] == {VOLCANO_GROUP: "glm-flash-decode-1"}
    assert template["spec"]["schedulerName"] == "volcano"
    assert template["spec"]["priorityClassName"] == "serving-high"
    assert "schedulingGroup" not in template["spec"]


def test_podgroups_are_applied_before_the_statefulsets():
    kinds = [m["kind"] for m in rendered(multi_pod("kubernetes"))]
    assert kinds.index("PodGroup") < kinds.index("StatefulSet")
    assert max(i for i, k in enumerate(kinds) if k == "PodGroup") < kinds.index("StatefulSet")


def test_kubernetes_renders_gang_podgroups_named_by_their_immutable_spec():
    manifests = rendered(multi_pod("kubernetes", domainLabel=DOMAIN, gangTopology=True))
    groups = {g["metadata"]["labels"][ROLE] + g["metadata"]["labels"][INSTANCE]: g
              for g in of_kind(manifests, "PodGroup")}
    decode = groups["decode0"]
    assert decode["apiVersion"] == "scheduling.k8s.io/v1alpha2"
    assert decode["spec"] == {"schedulingPolicy": {"gang": {"minCount": 2}},
                              "schedulingConstraints": {"topology": [{"key": DOMAIN}]}}
    assert groups["prefill0"]["spec"]["schedulingPolicy"] == {"gang": {"minCount": 1}}
    name = decode["metadata"]["name"]
    assert name.startswith("glm-flash-decode-0-") and len(name) == len("glm-flash-decode-0-") + 8
    # Same spec, same digest; the pods name their own instance's group.
    assert groups["decode1"]["metadata"]["name"] == name.replace("decode-0-", "decode-1-")
    spec = pod_spec(manifests, "glm-flash-decode-0")
    assert spec["schedulingGroup"] == {"podGroupName": name}
    assert "schedulerName" not in spec  # the default scheduler does it
    assert "annotations" not in statefulset(manifests, "glm-flash-decode-0")["spec"]["template"]["metadata"]
    # Another pod count is another (immutable) spec: a new name, so apply never edits one in place.
    bigger = multi_pod("kubernetes", domainLabel=DOMAIN, gangTopology=True)
    bigger["spec"]["decode"]["dataParallelSize"] = 6
    renamed = next(g for g in of_kind(rendered(bigger), "PodGroup")
                   if g["metadata"]["labels"][ROLE] == "decode")
    assert renamed["spec"]["schedulingPolicy"]["gang"]["minCount"] == 3
    assert renamed["metadata"]["name"] != name



def _recorded(doc: dict, sts: dict) -> dict | None:
    """The PodGroup `sts` (an instance's StatefulSet as some revision rendered it) needs under `doc`."""
    validation = validate(doc)
    assert validation.resolved is not None
    labels = sts["metadata"]["labels"]
    return scheduling.recorded_pod_group(validation.resolved, labels[ROLE], int(labels[INSTANCE]), sts)


@pytest.mark.parametrize("gang, placement", [("volcano", {}), ("kubernetes", {}),
                                             ("kubernetes", {"domainLabel": DOMAIN, "gangTopology": True})])
def test_a_stateful_set_of_the_spec_needs_the_spec_s_podgroup(gang, placement):
    """One construction: the group derived from an instance's StatefulSet (as a revision record holds
    it) is the spec's own group when the StatefulSet is the spec's."""
    doc = multi_pod(gang, **placement)
    doc["spec"]["scheduling"]["priorityClassName"] = "serving-high"
    manifests = rendered(doc)
    groups = {(g["metadata"]["labels"][ROLE], g["metadata"]["labels"][INSTANCE]): g
              for g in of_kind(manifests, "PodGroup")}
    assert len(groups) == 4
    for sts in serving_sets(manifests):
        labels = sts["metadata"]["labels"]
        assert _recorded(doc, sts) == groups[labels[ROLE], labels[INSTANCE]]
    assert _recorded(multi_pod(), statefulset(rendered(multi_pod()), "glm-flash-decode-0")) is None


def test_an_old_revisions_stateful_set_keeps_its_own_podgroup_under_a_new_spec():
    """What the pods of an instance not moved yet need, whatever the spec says now: their group's name
    and count, their NPUs, and kube-scheduler's topology constraint as their group's name has it."""
    before = multi_pod("kubernetes", domainLabel=DOMAIN)
    old = statefulset(rendered(before), "glm-flash-decode-1")
    (own,) = [g for g in of_kind(rendered(before), "PodGroup") if g["metadata"]["name"].startswith(
        "glm-flash-decode-1-")]
    now = multi_pod("kubernetes", domainLabel=DOMAIN, gangTopology=True)
    now["spec"]["decode"]["dataParallelSize"] = 6
    assert _recorded(now, old) == own  # no topology, 2 pods: the immutable spec its name digests
    assert _recorded(now, old)["metadata"]["name"] == pod_spec(rendered(before), "glm-flash-decode-1")[
        "schedulingGroup"]["podGroupName"]
    # And back: a group with the constraint stays one with it after gangTopology is turned off.
    with_topology = statefulset(rendered(now), "glm-flash-decode-1")
    group = _recorded(before, with_topology)
    assert group is not None and group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 3}},
                                                   "schedulingConstraints": {"topology": [{"key": DOMAIN}]}}
    # Volcano's group of a StatefulSet from before the switch to gang none: still its pods' group.
    volcano = statefulset(rendered(multi_pod("volcano")), "glm-flash-decode-0")
    group = _recorded(multi_pod(), volcano)
    assert group is not None and group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {"minMember": 2, "minResources": {NPU: 16}}
    # A name no candidate spec digests to (a topology the template does not show) is not guessed at:
    # an apply under it could not change the existing group's immutable spec.
    unknown = copy.deepcopy(old)
    unknown["spec"]["template"]["spec"]["schedulingGroup"]["podGroupName"] = "glm-flash-decode-1-00000000"
    assert _recorded(now, unknown) is None
    # A StatefulSet from before gang scheduling needs no group, whatever the spec has now.
    assert _recorded(multi_pod("volcano"), statefulset(rendered(multi_pod()), "glm-flash-decode-0")) is None

def test_scheduler_name_overrides_the_default():
    doc = multi_pod("volcano")
    doc["spec"]["scheduling"]["schedulerName"] = "volcano-ascend"
    assert pod_spec(rendered(doc), "glm-flash-decode-0")["schedulerName"] == "volcano-ascend"
    doc = multi_pod()
    doc["spec"]["scheduling"]["schedulerName"] = "my-scheduler"
    assert pod_spec(rendered(doc), "glm-flash-prefill-0")["schedulerName"] == "my-scheduler"


def _terms(affinity: dict, kind: str, how: str) -> list[dict]:
    return list(affinity.get(kind, {}).get(f"{how}DuringSchedulingIgnoredDuringExecution", []))


def test_domain_label_keeps_an_instance_in_one_domain_near_prefill_and_apart_from_its_peers():
    manifests = rendered(multi_pod(domainLabel=DOMAIN))
    decode = pod_spec(manifests, "glm-flash-decode-1")["affinity"]
    (together,) = _terms(decode, "podAffinity", "required")
    assert together == {"labelSelector": {"matchLabels": {DEPLOYMENT: "glm-flash", ROLE: "decode",
                                                          INSTANCE: "1"}}, "topologyKey": DOMAIN}
    (near,) = _terms(decode, "podAffinity", "preferred")
    assert near["podAffinityTerm"] == {"labelSelector": {"matchLabels": {DEPLOYMENT: "glm-flash",
                                                                         ROLE: "prefill"}},
                                       "topologyKey": DOMAIN}
    (apart,) = _terms(decode, "podAntiAffinity", "preferred")
    assert apart["podAffinityTerm"] == {
        "labelSelector": {"matchLabels": {DEPLOYMENT: "glm-flash", ROLE: "decode"},
                          "matchExpressions": [{"key": INSTANCE, "operator": "NotIn", "values": ["1"]}]},
        "topologyKey": DOMAIN}
    assert near["weight"] > apart["weight"] > 0
    (node_each,) = _terms(decode, "podAntiAffinity", "required")
    assert node_each["topologyKey"] == HOSTNAME
    # A one-pod prefill instance needs no togetherness term, only to keep apart from the other one.
    prefill = pod_spec(manifests, "glm-flash-prefill-0")["affinity"]
    assert set(prefill) == {"podAntiAffinity"}
    (apart,) = _terms(prefill, "podAntiAffinity", "preferred")
    assert apart["podAffinityTerm"]["labelSelector"]["matchExpressions"][0]["values"] == ["0"]


def test_single_instances_are_not_spread_and_decode_without_prefill_prefers_nothing():
    doc = example(GLM)
    doc["spec"]["placement"] = {"domainLabel": DOMAIN}
    doc["spec"]["prefill"]["replicas"] = 0
    manifests = rendered(doc)
    assert "affinity" not in pod_spec(manifests, "glm-flash-decode-0")


def test_the_users_affinity_is_kept_and_extended():
    user = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "accelerator", "operator": "In", "values": ["ascend-910"]}]}]}},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 7, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "noisy"}},
                                              "topologyKey": HOSTNAME}}]},
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 3, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "cache"}},
                                              "topologyKey": DOMAIN}}]},
    }
    doc = multi_pod(domainLabel=DOMAIN)
    doc["spec"]["decode"]["affinity"] = copy.deepcopy(user)
    affinity = pod_spec(rendered(doc), "glm-flash-decode-0")["affinity"]
    assert affinity["nodeAffinity"] == user["nodeAffinity"]
    anti = _terms(affinity, "podAntiAffinity", "preferred")
    assert anti[0] == user["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert len(anti) == 2 and anti[1]["podAffinityTerm"]["topologyKey"] == DOMAIN
    near = _terms(affinity, "podAffinity", "preferred")
    assert near[0]["weight"] == 3
    assert near[1]["podAffinityTerm"]["labelSelector"]["matchLabels"][ROLE] == "prefill"
    assert len(_terms(affinity, "podAffinity", "required")) == 1
    assert len(_terms(affinity, "podAntiAffinity", "required")) == 1
    assert doc["spec"]["decode"]["affinity"] == user  # the spec itself is untouched


def _error(doc: dict) -> tuple[str, str]:
    validation = validate(doc)
    assert not validation.ok
    finding = validation.errors[0]
    return finding.path, finding.message


@pytest.mark.parametrize(("change", "path", "words"), [
    ({"scheduling": {"gang": "kubernetes", "queue": "inference"}}, "spec.scheduling", "queue"),
    ({"scheduling": {"gang": "volcano"}, "placement": {"domainLabel": DOMAIN, "gangTopology": True}},
     "spec", "scheduling.gang to kubernetes"),
    ({"placement": {"gangTopology": True}, "scheduling": {"gang": "kubernetes"}}, "spec.placement",
     "set domainLabel"),
    ({"scheduling": {"gang": "slurm"}}, "spec.scheduling.gang", "kubernetes"),
    ({"placement": {"domainLabel": "not a label"}}, "spec.placement.domainLabel", ""),
])
def test_bad_scheduling_or_placement_names_the_field(change, path, words):
    doc = example(GLM)
    doc["spec"] |= change
    got_path, message = _error(doc)
    assert got_path == path and words in message, (got_path, message)
