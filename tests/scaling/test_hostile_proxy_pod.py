"""A tenant's proxy pods cannot stall or bloat the cluster-wide operator (issue 26 item 4).

`spec.proxy.image` is the tenant's, and the operator reads every proxy pod's /pd/state while a
removed instance drains. Here a PDDeployment's two proxy pods (kwok pods with loopback IPs,
support/podnet.py) are served by support/misbehaving.py: one streams 300 MiB, the other drips a
sound answer (the membership the operator wrote, nothing in flight: it would end the drain) one
byte every 2 s. The real operator, as the chart installs it, scales that deployment's decode down:
- it counts both pods as unknown (status.draining says their state cannot be read, naming the size
  cap and the deadline) and so keeps the departing instance, as it does for any unreadable proxy;
- meanwhile it reconciles another PDDeployment to Ready;
- its peak RSS stays under the chart's memory limit.
Only conditions are waited for; nothing asserts a duration.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator

import pytest
import yaml

from pd_operator.api.labels import DEPLOYMENT, ROLE
from pd_operator.api.types import ProxySpec
from pd_operator.controller.proxy_state import MAX_ANSWER_BYTES
from pd_operator.proxy.membership import ProxyState, state_document
from pd_operator.render.proxy import COMPONENT as PROXY
from pd_operator.render.proxy import members
from support.cluster import DEFAULT_NODES, ControlPlane, wait_for
from support.fixtures import keep_workdir
from support.fleet import create, fleet_doc, merge_patch
from support.installed import condition, get_pdd, weights_claim
from support.kube import CHART
from support.misbehaving import Misbehaving
from support.podnet import loopback

pytestmark = [pytest.mark.integration, pytest.mark.scaling]

TIMEOUT_S = 180
HOSTILE, OTHER = "hostile-001", "other-002"
DEPARTING = f"{HOSTILE}-decode-1"


@pytest.fixture(scope="module")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """This module's own control plane: its nodes hand pods loopback IPs this test can serve."""
    cp = ControlPlane(nodes=[loopback(DEFAULT_NODES[0])]).start()
    yield cp
    cp.stop(keep=keep_workdir(request))


def _memory_limit_bytes() -> int:
    limit = yaml.safe_load((CHART / "values.yaml").read_text())["resources"]["limits"]["memory"]
    assert limit.endswith("Mi"), limit
    return int(limit[:-2]) << 20


def _peak_rss_bytes(pid: int) -> int:
    """The process's high-water mark of resident memory (VmHWM): no sampling can miss a peak."""
    with open(f"/proc/{pid}/status") as status:
        (line,) = [x for x in status if x.startswith("VmHWM:")]
    return int(line.split()[1]) << 10


def _proxy_pods(cp: ControlPlane, namespace: str) -> list[dict]:
    selector = urllib.parse.quote(f"{DEPLOYMENT}={HOSTILE},{ROLE}={PROXY}")
    pods = cp.api("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")["items"]
    return [p for p in pods if p["status"].get("podIP") and p["status"].get("phase") == "Running"]


def _ready(cp: ControlPlane, namespace: str, name: str) -> bool:
    return condition(get_pdd(cp, namespace, name), "Ready").get("status") == "True"


def _draining(cp: ControlPlane, namespace: str) -> dict[str, dict]:
    return {d["name"]: d for d in get_pdd(cp, namespace, HOSTILE).get("status", {}).get("draining") or []}


def test_a_hostile_proxy_pod_neither_stalls_nor_bloats_the_operator(control_plane, namespace, start_operator):
    cp = control_plane
    op = start_operator()
    hostile = fleet_doc(1, namespace, decode_replicas=2, prefix="hostile")
    hostile["spec"]["proxy"]["replicas"] = 2
    cp.create_weights_volume(namespace, str(weights_claim(hostile)))
    create(cp, hostile)
    wait_for(f"{HOSTILE} Ready", lambda: _ready(cp, namespace, HOSTILE), TIMEOUT_S)
    flood_pod, drip_pod = wait_for("two running proxy pods with IPs",
                                   lambda: len(pods := _proxy_pods(cp, namespace)) == 2 and pods, TIMEOUT_S)
    port = ProxySpec.model_validate(hostile["spec"].get("proxy", {})).admin_port  # where /pd/state is read
    config_map = f"/api/v1/namespaces/{namespace}/configmaps/{HOSTILE}-proxy"

    def sound_and_idle() -> bytes:
        """What a sound proxy pod would answer once it routes by the current membership with
        nothing in flight: read whole, it would let the drain end."""
        membership = members(cp.api("GET", config_map))
        assert membership is not None
        return json.dumps(state_document(ProxyState(membership.version, {}))).encode()

    with Misbehaving(flood_pod["status"]["podIP"], port, "flood-unsized") as flood, \
            Misbehaving(drip_pod["status"]["podIP"], port, "drip", body=sound_and_idle, interval=2.0) as drip:
        merge_patch(cp, f"/apis/pd.serving.dev/v1alpha1/namespaces/{namespace}/pdroles/{HOSTILE}-decode",
                    {"spec": {"replicas": 1}})

        def unknown() -> str | None:
            waiting = (_draining(cp, namespace).get(DEPARTING) or {}).get("waitingFor", "")
            return waiting if all(p["metadata"]["name"] in waiting for p in (flood_pod, drip_pod)) else None
        waiting = wait_for(f"status.draining to count both proxy pods of {HOSTILE} unknown", unknown,
                           TIMEOUT_S)
        assert waiting.count("cannot be read") == 2, waiting
        assert f"over the cap of {MAX_ANSWER_BYTES} bytes" in waiting, waiting
        assert "no whole answer within" in waiting, waiting
        assert flood.connections >= 1 and drip.connections >= 1

        other = fleet_doc(2, namespace, prefix="other")
        create(cp, other)
        wait_for(f"{OTHER} Ready while {HOSTILE} drains", lambda: _ready(cp, namespace, OTHER), TIMEOUT_S)
        # Still held: unknown is not idle, and the drain's bound (300 s) has not passed.
        assert DEPARTING in _draining(cp, namespace), get_pdd(cp, namespace, HOSTILE).get("status")
        assert cp.find(f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{DEPARTING}") is not None
        assert op.running()
        peak = _peak_rss_bytes(op.process.pid)
    assert flood.sent > MAX_ANSWER_BYTES, "the flood pod was never read past the cap"
    assert peak < _memory_limit_bytes(), f"the operator's peak RSS {peak >> 20} MiB"
