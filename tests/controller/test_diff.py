"""The pure planner: what to apply, what to prune, what to leave alone."""

from __future__ import annotations

import copy
import hashlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pd_operator.api.labels import APPLIED_HASH
from pd_operator.controller.diff import diff, key, manifest_hash
from support.controller_fakes import OWNER_UID, desired, validated


def _names(objs: list[dict]) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objs]


def test_stamp_adopts_with_a_controller_reference_and_records_the_hash():
    manifest = desired(validated())[0]
    (ref,) = manifest["metadata"]["ownerReferences"]
    assert ref["uid"] == OWNER_UID and ref["controller"] is True and ref["blockOwnerDeletion"] is True
    assert manifest["metadata"]["annotations"][APPLIED_HASH] == manifest_hash(manifest)


def test_the_hash_is_the_canonical_text_without_itself_so_an_upgrade_keeps_it():
    """The applied hash on every child is the SHA-256 of its compact, key-sorted JSON without the hash
    annotation (and without an annotations map that only held it): an operator computing it another
    way would see every child of every PDDeployment as changed after an upgrade."""
    for manifest in desired(validated()):
        before = copy.deepcopy(manifest)
        bare = copy.deepcopy(manifest)
        bare["metadata"]["annotations"].pop(APPLIED_HASH)
        if not bare["metadata"]["annotations"]:
            del bare["metadata"]["annotations"]
        text = json.dumps(bare, sort_keys=True, separators=(",", ":"))
        expected = hashlib.sha256(text.encode()).hexdigest()[:16]
        assert manifest_hash(manifest) == expected == manifest_hash(bare)
        assert manifest == before  # read, not edited


def test_hash_follows_the_spec_and_ignores_itself():
    a = desired(validated())
    b = desired(validated(decode__replicas=2))
    assert [x["metadata"]["annotations"][APPLIED_HASH] for x in a] == \
        [x["metadata"]["annotations"][APPLIED_HASH] for x in desired(validated())]
    sts = {key(m): m for m in a if m["kind"] == "StatefulSet"}
    changed = [m for m in b if key(m) in sts and manifest_hash(m) != manifest_hash(sts[key(m)])]
    assert not changed, "adding a decode instance must not touch the existing StatefulSets"
    before = {key(m): manifest_hash(m) for m in a}
    (routes,) = [m for m in b if m["metadata"]["name"] == "glm-flash-proxy" and m["kind"] == "ConfigMap"]
    (proxy,) = [m for m in b if m["metadata"]["name"] == "glm-flash-proxy" and m["kind"] == "Deployment"]
    assert manifest_hash(routes) != before[key(routes)], "the proxy's membership lists the new instance"
    assert manifest_hash(proxy) == before[key(proxy)], "and the proxy Deployment does not roll"


def test_nothing_observed_applies_everything_in_render_order():
    want = desired(validated())
    result = diff(want, [], OWNER_UID)
    assert result.apply == want and not result.prune and result.unchanged == 0


def test_unchanged_children_need_no_request_even_with_server_added_fields():
    want = desired(validated())
    observed = copy.deepcopy(want)
    for obj in observed:
        obj["metadata"]["resourceVersion"] = "7"
        obj["status"] = {"readyReplicas": 1}
    result = diff(want, observed, OWNER_UID)
    assert result.apply == [] and result.prune == [] and result.unchanged == len(want)


def test_changed_missing_and_unwanted_children():
    old = desired(validated(decode__replicas=2))
    new = desired(validated())
    observed = [o for o in old if o["metadata"]["name"] != "glm-flash-kv"]
    result = diff(new, observed, OWNER_UID)
    assert _names(result.prune) == ["Service/glm-flash-decode-1", "StatefulSet/glm-flash-decode-1"]
    assert _names(result.apply) == ["ConfigMap/glm-flash-proxy", "NetworkPolicy/glm-flash-kv"]


def test_foreign_objects_are_never_applied_over_nor_pruned():
    want = desired(validated())
    foreign_same_name = copy.deepcopy(want[0])
    foreign_same_name["metadata"]["ownerReferences"] = [{"uid": "someone-else"}]
    foreign_other = copy.deepcopy(want[1])
    foreign_other["metadata"]["name"] = "hand-made"
    del foreign_other["metadata"]["ownerReferences"]
    result = diff(want, [foreign_same_name, foreign_other], OWNER_UID)
    assert _names(result.blocked) == _names([want[0]])
    assert key(want[0]) not in {key(m) for m in result.apply}
    assert _names(result.foreign) == _names([foreign_same_name, foreign_other])
    assert result.prune == []


def test_terminating_children_are_not_deleted_again():
    old = desired(validated(decode__replicas=2))
    for obj in old:
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert diff(desired(validated()), old, OWNER_UID).prune == []


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_plan_partitions_desired_and_only_prunes_owned_leftovers(data):
    want = desired(validated(decode__replicas=2))
    observed = data.draw(st.lists(st.sampled_from(want), unique_by=key))
    observed = copy.deepcopy(observed)
    for obj in observed:
        if data.draw(st.booleans()):
            obj["metadata"]["annotations"][APPLIED_HASH] = "stale"
        if data.draw(st.booleans()):
            obj["metadata"]["ownerReferences"] = [{"uid": "other"}]
    subset = data.draw(st.lists(st.sampled_from(want), unique_by=key))
    result = diff(subset, observed, OWNER_UID)
    handled = {key(m) for m in result.apply} | {key(m) for m in result.blocked}
    assert len(handled) + result.unchanged == len(subset)
    assert {key(m) for m in result.prune}.isdisjoint({key(m) for m in subset})
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == OWNER_UID for o in result.prune)


def test_a_hand_edit_of_an_owned_field_is_reapplied_even_with_the_hash_left_alone():
    want = desired(validated())
    observed = copy.deepcopy(want)
    sts = next(o for o in observed if o["kind"] == "StatefulSet")
    sts["spec"]["replicas"] = 5
    sts["spec"]["template"]["spec"]["containers"][0]["image"] = "hand/edited:1"
    assert _names(diff(want, observed, OWNER_UID).apply) == _names([sts])


def test_server_side_text_forms_of_numbers_are_not_drift():
    from pd_operator.controller.diff import holds
    assert holds({"limits": {"cpu": "8"}, "extra": 1}, {"limits": {"cpu": 8}})
    assert not holds({"args": ["a"]}, {"args": ["a", "b"]})


def test_an_immutable_podgroup_missing_a_dropped_field_is_not_applied_again():
    """kube-apiserver drops spec.schedulingConstraints when TopologyAwareWorkloadScheduling is off; a
    PodGroup's spec is immutable, so applying it again could never add it back."""
    v = validated(scheduling={"gang": "kubernetes"}, placement={"domainLabel": "example.com/pod",
                                                               "gangTopology": True},
                  decode__dataParallelSize=4)
    want = desired(v)
    observed = copy.deepcopy(want)
    groups = [o for o in observed if o["kind"] == "PodGroup"]
    assert groups and all("schedulingConstraints" in g["spec"] for g in groups)
    for g in groups:
        del g["spec"]["schedulingConstraints"]
    assert diff(want, observed, OWNER_UID).apply == []
    for g in groups:  # a PodGroup that is not the one last applied is applied
        g["metadata"]["annotations"][APPLIED_HASH] = "0" * 16
    assert _names(diff(want, observed, OWNER_UID).apply) == _names(
        [m for m in want if m["kind"] == "PodGroup"])
