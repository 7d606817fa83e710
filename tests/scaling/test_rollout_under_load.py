"""A new image rolls through 2 prefill and 2 decode instances under load without failing a request
(issue 25).

The GLM example on kwok nodes with loopback pod IPs (support/podnet.py): the real `pd-proxy` in the
proxy pod, a fake engine in each instance's leader pod, clients sending requests through the proxy.
The image changes (a new kv-layout hash too: the image is part of it), once with the default
rollout (maxSurge 1, maxUnavailable 0: a third instance per role on the new template serves while
the two old ones are replaced, then leaves) and once in place (maxUnavailable 1, no surge).
Checked:
- no request fails (a pod deleted while it carries a request would cut it);
- at every sample of the membership the proxy routes by, each role has at least
  replicas - maxUnavailable instances that can pair (same KV layout in the other role), and no
  more than replicas + maxSurge;
- the rollout ends with every instance's pods on the new revision and Progressing=Complete, the
  PDRoles' status counting them updated, and no surge instance left;
- the audit log: every pod DELETE of an instance (and a surge instance's StatefulSet DELETE) comes
  after the last moment the proxy was seen routing to it, and the operator wrote the membership
  before it.
The proxy's image is set apart so the image change does not roll the proxy Deployment itself
(a proxy pod replaced under load is another matter than the engines' rollout).
Only conditions are waited for; nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from pd_operator.api.labels import REVISION
from pd_operator.api.types import ROLES, RolloutSpec
from support.cluster import ControlPlane
from support.fakevllm import Load
from support.podnet import Kubelet
from support.rollout import (
    GLM,
    IN_PLACE,
    INSTANCES,
    NEW_IMAGE,
    apply,
    create,
    deletes_pod_of,
    live_pods,
    loopback_plane,
    rolled,
    status,
    status_until,
    two_by_two,
)

pytestmark = [pytest.mark.integration, pytest.mark.rollout]

CLIENTS = 4
SAMPLE_S = 0.2

control_plane = pytest.fixture(scope="module")(loopback_plane)


class Sampler:
    """Samples the membership the proxy routes by: the fewest and the most pairable members per
    role, and per instance the audit position of the last sample that saw the proxy route to it
    before it first left (to be replaced, or as a surge instance, removed)."""

    def __init__(self, cp: ControlPlane, kubelet: Kubelet) -> None:
        self.cp, self.kubelet = cp, kubelet
        self.fewest = dict.fromkeys(ROLES, 99)
        self.most = dict.fromkeys(ROLES, 0)
        self.last_routed: dict[str, int] = {}
        self.left: set[str] = set()
        self.samples = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        proxy = await self.kubelet.proxy()
        while not self._stop.is_set():
            mark = self.cp.audit.mark()
            listed = await self.kubelet.membership()
            state = await proxy.state()
            if listed is not None and state.version == listed.version:  # what the proxy routes by now
                self.samples += 1
                for role in ROLES:
                    pairable = {u.name for u in listed.pairable(role)}
                    self.fewest[role] = min(self.fewest[role], len(pairable))
                    self.most[role] = max(self.most[role], len(pairable))
                    self.left |= set(self.last_routed) - pairable
                    for name in pairable - self.left:
                        self.last_routed[name] = mark
            await asyncio.sleep(SAMPLE_S)

    def stop(self) -> None:
        self._stop.set()


SURGED = {role: f"{GLM}-{role}-2" for role in ROLES}
"""The surge instance of each role (the first ordinal past replicas)."""


async def _scenario(cp: ControlPlane, namespace: str, user: str, workdir: pathlib.Path,
                    rollout: dict) -> None:
    doc = two_by_two(namespace)
    for role in ROLES:
        doc["spec"][role]["rollout"] = dict(rollout)
    create(cp, doc)
    async with Kubelet(cp, namespace, GLM, workdir / "pods") as kubelet:
        await kubelet.routed(INSTANCES["prefill"], INSTANCES["decode"])
        old = {role: status(cp, namespace)[role]["revision"] for role in ROLES}
        load = Load((await kubelet.proxy()).url, clients=CLIENTS)
        sampler = Sampler(cp, kubelet)
        async with load:
            await load.completed_after(0, 10)
            sampling = asyncio.create_task(sampler.run())
            patched = cp.audit.mark()
            doc["spec"]["image"]["name"] = NEW_IMAGE
            apply(cp, doc)
            final = await status_until(cp, namespace, "every instance on the new revision and "
                                       "Progressing=Complete", rolled(old))
            await kubelet.routed(INSTANCES["prefill"], INSTANCES["decode"])
            await load.completed_after(load.mark(), 10)
            sampler.stop()
            await sampling
            await load.stop()

    assert load.failures == [], load.failures[:10]
    assert kubelet.errors() == []
    assert sampler.samples >= 2  # it sampled the membership the proxy routed by (how often depends on load)
    spec = RolloutSpec.model_validate(rollout)
    unavailable, surge = spec.max_unavailable, spec.max_surge
    # At least replicas - maxUnavailable (reached: it moved), at most replicas + maxSurge; a surge
    # instance was routed (it may join in the reconcile in which an old one leaves, so the most
    # sampled need not reach the bound).
    assert sampler.fewest == dict.fromkeys(ROLES, 2 - unavailable), sampler.fewest
    assert all(sampler.most[role] <= 2 + surge for role in ROLES), sampler.most
    assert {n for n in sampler.last_routed if n.endswith("-2")} == (set(SURGED.values()) if surge else set())
    statefulsets = cp.api("GET", f"/apis/apps/v1/namespaces/{namespace}/statefulsets")["items"]
    assert {o["metadata"]["name"] for o in statefulsets if o["metadata"]["name"].startswith(f"{GLM}-")
            and not o["metadata"].get("deletionTimestamp")} == INSTANCES["prefill"] | INSTANCES["decode"]
    pods = live_pods(cp, namespace)
    for role in ROLES:
        revision = final[role]["revision"]
        assert {i["name"]: i["revision"] for i in final[role]["instances"]} == dict.fromkeys(INSTANCES[role],
                                                                                            revision)
        serving = [p for p in pods if p["metadata"]["labels"]["pd.serving.dev/role"] == role]
        assert {p["metadata"]["labels"][REVISION] for p in serving} == {revision}
        pdr = cp.api("GET", f"/apis/pd.serving.dev/v1alpha1/namespaces/{namespace}/pdroles/{GLM}-{role}")
        assert pdr["status"]["updatedReplicas"] == 2
    events = cp.audit.events(patched, namespace=namespace)
    writes = [i for i, e in enumerate(events) if e.user == user and e.write and e.resource == "configmaps"
              and e.name == f"{GLM}-proxy" and e.code < 300]
    for instance in INSTANCES["prefill"] | INSTANCES["decode"]:
        removed = [i for i, e in enumerate(events) if deletes_pod_of(e, instance)]
        assert removed, f"{instance}'s pods were never replaced"
        assert writes and writes[0] < removed[0], f"{instance}: a pod DELETE before the membership write"
        later = [e for e in cp.audit.events(sampler.last_routed[instance], namespace=namespace)
                 if deletes_pod_of(e, instance)]
        assert len(later) == len(removed), f"{instance}: its pods were deleted while the proxy routed to it"
    for instance in SURGED.values() if surge else ():
        gone = [i for i, e in enumerate(events) if e.verb == "delete" and e.resource == "statefulsets"
                and e.name == instance and e.code < 300]
        assert gone, f"surge instance {instance} was never removed"
        assert [e for e in cp.audit.events(sampler.last_routed[instance], namespace=namespace)
                if e.verb == "delete" and e.resource == "statefulsets" and e.name == instance], \
            f"{instance}: removed while the proxy routed to it"


@pytest.mark.parametrize("rollout", [{}, IN_PLACE], ids=["default", "in-place"])
def test_a_new_image_rolls_through_under_load_without_a_failed_request(control_plane, namespace, release,
                                                                      start_operator, tmp_path, rollout):
    start_operator()
    asyncio.run(_scenario(control_plane, namespace, release.user, tmp_path, rollout))
