"""The rollout's controls on the real control plane, with the real pd-proxy and fake engines in the
pods (support/podnet.py) under client load (issue 25): `partition` holds the instances below it,
`paused` stops between instances, a bad image stops after one instance per role at its progress
deadline while the others keep serving, until the previous spec is applied again, and scaling
during a (paused) rollout adds instances on the new template.

2 prefill and 2 decode instances replaced in place (maxUnavailable 1, no surge: support/rollout.py
IN_PLACE; the defaults surge, test_rollout_under_load.py), so an image change moves instance 1 of
each role first and instance 0 after. Every wait is for a status,
the membership or the audit log; nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from pd_operator.api.types import ROLES
from support.cluster import ControlPlane
from support.fakevllm import Load, until
from support.kube import kubectl
from support.podnet import Kubelet
from support.rollout import (
    BAD_IMAGE,
    GLM,
    IN_PLACE,
    INSTANCES,
    NEW_IMAGE,
    CrashingImage,
    apply,
    create,
    deleted,
    loopback_plane,
    pod_revisions,
    progressing,
    rolled,
    status,
    status_until,
    two_by_two,
)

pytestmark = [pytest.mark.integration, pytest.mark.rollout]

control_plane = pytest.fixture(scope="module")(loopback_plane)

FIRST = {f"{GLM}-{role}-1" for role in ROLES}
"""What moves first (highest ordinal first, one per role)."""
REST = {f"{GLM}-{role}-0" for role in ROLES}
DEADLINE_S = 5


async def _serving(cp: ControlPlane, namespace: str, doc: dict, kubelet: Kubelet) -> dict[str, str]:
    create(cp, doc)
    await kubelet.routed(INSTANCES["prefill"], INSTANCES["decode"])
    return {role: status(cp, namespace)[role]["revision"] for role in ROLES}


def _set_rollout(doc: dict, **fields: object) -> None:
    for role in ROLES:
        doc["spec"][role].setdefault("rollout", {}).update(fields)


async def _partition(cp: ControlPlane, namespace: str, workdir: pathlib.Path) -> None:
    doc = two_by_two(namespace)
    _set_rollout(doc, **IN_PLACE)
    async with Kubelet(cp, namespace, GLM, workdir) as kubelet:
        old = await _serving(cp, namespace, doc, kubelet)
        before = pod_revisions(cp, namespace)
        async with Load((await kubelet.proxy()).url) as load:
            await load.completed_after(0, 5)
            mark = cp.audit.mark()
            doc["spec"]["image"]["name"] = NEW_IMAGE
            _set_rollout(doc, partition=1)
            apply(cp, doc)
            final = await status_until(
                cp, namespace, "instance 1 of each role updated and Progressing=RolloutPartitioned",
                lambda st: all((st.get(r) or {}).get("updatedInstances") == 1 and st[r]["revision"] != old[r]
                               for r in ROLES) and progressing(st) == ("False", "RolloutPartitioned"))
            await kubelet.routed(INSTANCES["prefill"], INSTANCES["decode"])
            await load.completed_after(load.mark(), 5)
            await load.stop()
        assert load.failures == [], load.failures[:10]
        assert kubelet.errors() == []
    after = pod_revisions(cp, namespace)
    for instance in REST:
        assert after[instance] == before[instance], f"{instance} left the old template"
        assert deleted(cp, mark, namespace, instance) == [], f"{instance}'s pods were deleted"
    for role in ROLES:
        instance = f"{GLM}-{role}-1"
        assert after[instance] == {final[role]["revision"]} != before[instance]
        assert deleted(cp, mark, namespace, instance), f"{instance}'s pods were never replaced"


async def _pause(cp: ControlPlane, namespace: str, workdir: pathlib.Path) -> None:
    doc = two_by_two(namespace)
    _set_rollout(doc, **IN_PLACE)
    async with Kubelet(cp, namespace, GLM, workdir) as kubelet:
        old = await _serving(cp, namespace, doc, kubelet)
        # A request held in decode-1 keeps it draining once the rollout takes it out: the pause
        # lands while the first instances move (no instance 0 may leave before decode-1 serves again:
        # it would leave its role with none serving).
        held = (await kubelet.engine(f"{GLM}-decode-1")).hold("answer")
        async with Load((await kubelet.proxy()).url) as load:
            await held.caught_at_least(1)
            started = cp.audit.mark()
            doc["spec"]["image"]["name"] = NEW_IMAGE
            apply(cp, doc)
            await status_until(cp, namespace, "decode-1 draining", lambda st: f"{GLM}-decode-1" in {
                d.get("name") for d in st.get("draining") or []})
            _set_rollout(doc, paused=True)
            apply(cp, doc)
            generation = int(cp.api("GET", f"/apis/pd.serving.dev/v1alpha1/namespaces/{namespace}/"
                                    f"pddeployments/{GLM}")["metadata"]["generation"])
            await status_until(cp, namespace, "the pause observed",
                               lambda st: st.get("observedGeneration", 0) >= generation)
            held.release()
            # Those already moving finish and re-join on the new template; then it holds.
            await status_until(cp, namespace, "Progressing=Unknown RolloutPaused",
                                        lambda st: progressing(st) == ("Unknown", "RolloutPaused"))
            await kubelet.routed(INSTANCES["prefill"], INSTANCES["decode"])
            seen = cp.audit.mark()
            assert {i for i in FIRST | REST if deleted(cp, started, namespace, i)} == FIRST
            paused = status(cp, namespace)
            assert progressing(paused) == ("Unknown", "RolloutPaused")
            assert all(paused[role]["updatedInstances"] == 1 for role in ROLES), paused
            revisions = pod_revisions(cp, namespace)
            for role in ROLES:
                assert revisions[f"{GLM}-{role}-1"] == {paused[role]["revision"]}, revisions
                assert revisions[f"{GLM}-{role}-0"] == {old[role]}, revisions
            for instance in FIRST | REST:
                assert deleted(cp, seen, namespace, instance) == [], f"{instance}: a pod DELETE while paused"

            resumed = cp.audit.mark()
            _set_rollout(doc, paused=False)
            apply(cp, doc)
            await status_until(cp, namespace, "every instance on the new revision and Progressing=Complete",
                               rolled(old))
            await kubelet.routed(INSTANCES["prefill"], INSTANCES["decode"])
            await load.completed_after(load.mark(), 5)
            await load.stop()
        assert load.failures == [], load.failures[:10]
        assert kubelet.errors() == []
    for instance in REST:
        assert deleted(cp, resumed, namespace, instance), f"{instance} did not move once unpaused"


async def _bad_image(cp: ControlPlane, namespace: str, workdir: pathlib.Path) -> None:
    doc = two_by_two(namespace)
    _set_rollout(doc, **IN_PLACE)
    with CrashingImage(cp, namespace, BAD_IMAGE) as crashing:
        async with Kubelet(cp, namespace, GLM, workdir) as kubelet:
            old = await _serving(cp, namespace, doc, kubelet)
            proxy = await kubelet.proxy()
            async with Load(proxy.url) as load:
                await load.completed_after(0, 5)
                bad = cp.audit.mark()
                good_image = doc["spec"]["image"]["name"]
                doc["spec"]["image"]["name"] = BAD_IMAGE
                _set_rollout(doc, progressDeadlineSeconds=DEADLINE_S)
                apply(cp, doc)
                stopped = await status_until(
                    cp, namespace, "Progressing=False ProgressDeadlineExceeded",
                    lambda st: progressing(st) == ("False", "ProgressDeadlineExceeded"))
                # The rest keep serving: the proxy routes by a membership of instance 0 of each role.
                state = await kubelet.routed({f"{GLM}-prefill-0"}, {f"{GLM}-decode-0"})
                assert set(state.upstreams) >= REST, state
                mark = load.mark()
                await load.completed_after(mark, 10)
                for role in ROLES:
                    assert stopped[role]["updatedInstances"] == 1, stopped
                for instance in REST:
                    assert deleted(cp, bad, namespace, instance) == [], f"{instance} moved to the bad image"
                assert crashing.crashed, "no pod ran the bad image"

                restored = cp.audit.mark()
                doc["spec"]["image"]["name"] = good_image
                apply(cp, doc)
                final = await status_until(
                    cp, namespace, "every instance back on the old revision and Progressing=Complete",
                    lambda st: all((st.get(r) or {}).get("updatedInstances") == 2
                                   and st[r]["revision"] == old[r] for r in ROLES)
                    and progressing(st) == ("False", "Complete"))
                await kubelet.routed(INSTANCES["prefill"], INSTANCES["decode"])
                await load.completed_after(load.mark(), 5)
                await load.stop()
            assert load.failures == [], load.failures[:10]
            assert kubelet.errors() == []
        crashing.check()
    assert pod_revisions(cp, namespace) == {i: {final[i.split("-")[-2]]["revision"]}
                                            for role in ROLES for i in INSTANCES[role]}
    for instance in REST:  # only what moved rolled back
        assert deleted(cp, bad, namespace, instance) == [], f"{instance}'s pods were deleted"
    for instance in FIRST:
        assert deleted(cp, restored, namespace, instance), f"{instance} was not rolled back"


async def _scale_during(cp: ControlPlane, namespace: str, workdir: pathlib.Path) -> None:
    doc = two_by_two(namespace)
    _set_rollout(doc, **IN_PLACE)
    async with Kubelet(cp, namespace, GLM, workdir) as kubelet:
        old = await _serving(cp, namespace, doc, kubelet)
        async with Load((await kubelet.proxy()).url) as load:
            await load.completed_after(0, 5)
            mark = cp.audit.mark()
            doc["spec"]["image"]["name"] = NEW_IMAGE
            _set_rollout(doc, paused=True)
            apply(cp, doc)
            await status_until(cp, namespace, "Progressing=Unknown RolloutPaused",
                               lambda st: progressing(st) == ("Unknown", "RolloutPaused"))
            for role in ROLES:  # as an HPA or a user scales a role
                await asyncio.to_thread(kubectl, cp.kubeconfig, "-n", namespace, "scale", "pdrole",
                                        f"{GLM}-{role}", "--replicas=3")
            added = {role: f"{GLM}-{role}-2" for role in ROLES}
            state = await kubelet.routed(INSTANCES["prefill"] | {added["prefill"]},
                                         INSTANCES["decode"] | {added["decode"]})
            for name in added.values():  # the new instances serve
                engine = await kubelet.engine(name)
                await until(f"{name} to get a request", lambda engine=engine: engine.received)
            await load.completed_after(load.mark(), 5)
            await load.stop()
        assert load.failures == [], load.failures[:10]
        assert kubelet.errors() == []
    assert set(state.upstreams) >= set(added.values())
    paused = status(cp, namespace)
    revisions = pod_revisions(cp, namespace)
    for role in ROLES:
        new = paused[role]["revision"]
        assert new != old[role]
        assert revisions[added[role]] == {new}, revisions  # the new instance: the new template
        for instance in INSTANCES[role]:  # the paused ones stay
            assert revisions[instance] == {old[role]}, revisions
            assert deleted(cp, mark, namespace, instance) == [], f"{instance}'s pods were deleted"


def test_partition_holds_the_instances_below_it(control_plane, namespace, start_operator, tmp_path):
    start_operator()
    asyncio.run(_partition(control_plane, namespace, tmp_path / "pods"))


def test_paused_stops_between_instances_and_resumes(control_plane, namespace, start_operator, tmp_path):
    start_operator()
    asyncio.run(_pause(control_plane, namespace, tmp_path / "pods"))


def test_a_bad_image_stops_at_the_deadline_and_the_old_spec_restores(control_plane, namespace,
                                                                   start_operator, tmp_path):
    start_operator()
    asyncio.run(_bad_image(control_plane, namespace, tmp_path / "pods"))


def test_scaling_during_a_rollout_adds_instances_on_the_new_template(control_plane, namespace, start_operator,
                                                                    tmp_path):
    start_operator()
    asyncio.run(_scale_during(control_plane, namespace, tmp_path / "pods"))
