"""A KV-layout-changing update under load never routes a request across layouts (issue 25).

The GLM example with 2 prefill and 2 decode instances on the real control plane, the real
`pd-proxy` and fake engines in the pods (support/podnet.py), under client load. Decode goes from
TP4 x DP2 to TP2 x DP4 on its 8 NPUs, which changes decode's block size and so the kv-layout hash:
old and new instances run side by side during the rollout, and pd-proxy may pair a prefill only with
a decode of its layout. Each fake engine runs with its pod's kv-layout hash and a decode records an
error when the KV it is told to pull has another layout (support/fakevllm.py; the first test shows
that check fires). Checked: no such error and no failed request, and the rollout ends with every
pod on the new layout and the proxy routing to all four instances. Engine pods are Ready only once
their engine listens. Only conditions are waited for.
"""

from __future__ import annotations

import asyncio
import pathlib

import aiohttp
import pytest

from pd_operator.api.labels import KV_LAYOUT
from pd_operator.api.types import ROLES
from support.cluster import READY_WHEN_SERVING_ENV, ControlPlane
from support.fakevllm import PREFILL_PARAMS, FakeEngine, Load, started
from support.podnet import Kubelet
from support.rollout import (
    GLM,
    INSTANCES,
    apply,
    create,
    live_pods,
    loopback_plane,
    progressing,
    status,
    status_until,
    two_by_two,
)

pytestmark = [pytest.mark.integration, pytest.mark.rollout]

control_plane = pytest.fixture(scope="module")(loopback_plane)


async def _pull_across_layouts() -> list[str]:
    prefill, decode = await started(FakeEngine("p", "prefill", layout="layout-a"),
                                    FakeEngine("d", "decode", layout="layout-b"))
    try:
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "x", "max_tokens": 1, "min_tokens": 1, "stream": False,
                    "kv_transfer_params": PREFILL_PARAMS}
            async with session.post(f"{prefill.url}/v1/completions", json=body,
                                    headers={"X-Request-Id": "r1"}) as resp:
                params = (await resp.json())["kv_transfer_params"]
            body = {"prompt": "x", "max_tokens": 8, "stream": False, "kv_transfer_params": params}
            async with session.post(f"{decode.url}/v1/completions", json=body,
                                    headers={"X-Request-Id": "r1"}) as resp:
                assert resp.status == 500
    finally:
        await asyncio.gather(prefill.stop(), decode.stop())
    return decode.errors


def test_a_fake_decode_refuses_kv_of_another_layout():
    errors = asyncio.run(_pull_across_layouts())
    assert len(errors) == 1 and "layout 'layout-a'" in errors[0] and "'layout-b'" in errors[0], errors


async def _scenario(cp: ControlPlane, namespace: str, workdir: pathlib.Path) -> None:
    doc = two_by_two(namespace)
    # Engine pods Ready only once their fake engine listens, as readiness probes make them: kwok would
    # mark a surge decode Ready at once and the proxy could route to it before it serves.
    for role in ROLES:
        doc["spec"][role].setdefault("env", []).append({"name": READY_WHEN_SERVING_ENV, "value": "1"})
    create(cp, doc)
    async with Kubelet(cp, namespace, GLM, workdir) as kubelet:
        await kubelet.routed(INSTANCES["prefill"], INSTANCES["decode"])
        before = status(cp, namespace)
        async with Load((await kubelet.proxy()).url) as load:
            await load.completed_after(0, 10)
            doc["spec"]["decode"].update(tensorParallelSize=2, dataParallelSize=4)
            apply(cp, doc)

            def done(st: dict) -> bool:
                layout = st.get("kvLayout") or {}
                return (layout.get("hash") != before["kvLayout"]["hash"]
                        and all((st.get(r) or {}).get("updatedInstances") == 2 for r in ROLES)
                        and st["decode"]["revision"] != before["decode"]["revision"]
                        and progressing(st) == ("False", "Complete"))
            final = await status_until(cp, namespace, "every instance updated and Progressing=Complete", done)
            await kubelet.routed(INSTANCES["prefill"], INSTANCES["decode"])
            await load.completed_after(load.mark(), 10)
            await load.stop()
        assert load.failures == [], load.failures[:10]
        assert kubelet.errors() == [], kubelet.errors()[:10]  # no KV pulled across layouts
        new = final["kvLayout"]["hash"]
        assert final["kvLayout"]["decodeBlockSize"] != before["kvLayout"]["decodeBlockSize"]
        # Both layouts served: the old decodes before they moved, the new ones after.
        served = {e.layout for e in kubelet.started if e.role == "decode" and e.received}
        assert served == {before["kvLayout"]["hash"], new}, served
    assert {p["metadata"]["labels"][KV_LAYOUT] for p in live_pods(cp, namespace)} == {new}


def test_a_layout_change_never_pairs_across_layouts(control_plane, namespace, start_operator, tmp_path):
    start_operator()
    asyncio.run(_scenario(control_plane, namespace, tmp_path / "pods"))
