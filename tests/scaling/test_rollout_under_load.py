"""A new image rolls through 2 prefill and 2 decode instances under load without failing a request
(issue 25).

The GLM example on kwok nodes with loopback pod IPs (support/podnet.py): the real `pd-proxy` in the
proxy pod, a fake engine in each instance's leader pod, clients sending requests through the proxy.
The image changes (a new kv-layout hash too: the image is part of it), with the default rollout
(maxUnavailable 1, no surge). Checked:
- no request fails (a pod deleted while it carries a request would cut it);
- at every sample of the membership the proxy routes by, each role has at least
  replicas - maxUnavailable = 1 instance that can pair (same KV layout in the other role);
- the rollout ends with every instance's pods on the new revision and Progressing=Complete, the
  PDRoles' status counting them updated;
- the audit log: every pod DELETE of an instance comes after the last moment the proxy was seen
  routing to it, and the operator wrote the membership before it.
The proxy's image is set apart so the image change does not roll the proxy Deployment itself
(a proxy pod replaced under load is another matter than the engines' rollout).
Only conditions are waited for; nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from pd_operator.api.labels import REVISION
from pd_operator.api.types import ROLES
from support.cluster import ControlPlane
from support.fakevllm import Load
from support.podnet import Kubelet
from support.rollout import (
    GLM,
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
    """Samples the membership the proxy routes by: the fewest pairable members per role, and per
    instance the audit position of the last sample that saw the proxy route to it before it first
    left (to be replaced)."""

    def __init__(self, cp: ControlPlane, kubelet: Kubelet) -> None:
        self.cp, self.kubelet = cp, kubelet
        self.fewest = dict.fromkeys(ROLES, 99)
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
                    self.left |= INSTANCES[role] - pairable
                    for name in pairable - self.left:
                        self.last_routed[name] = mark
            await asyncio.sleep(SAMPLE_S)

    def stop(self) -> None:
        self._stop.set()


async def _scenario(cp: ControlPlane, namespace: str, user: str, workdir: pathlib.Path) -> None:
    doc = two_by_two(namespace)
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
    assert sampler.fewest == {"prefill": 1, "decode": 1}, sampler.fewest  # 2 - maxUnavailable, and it moved
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


def test_a_new_image_rolls_through_under_load_without_a_failed_request(control_plane, namespace, release,
                                                                      start_operator, tmp_path):
    start_operator()
    asyncio.run(_scenario(control_plane, namespace, release.user, tmp_path))
