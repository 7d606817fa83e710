"""The KV-link gate with real processes: the rendered `kv-probe` command of a prefill pod and the
rendered `kv-link` command of a decode pod run on loopback, each with its own Mooncake engine. The
decode gate goes ready once it pulled and verified the prefill's test KV; the prefill probe is
stopped and the gate goes not ready; the operator's pure gate (controller/gate.py, links.py),
given the pods with the kv-link readiness the kubelet would report and the gate's state as the
operator reads it on the probe port, takes the decode instance out of the proxy's upstreams and says
why in DecodeReady and status.kvLinks.

What stands in for the cluster: the rendered ConfigMap's files at a temporary mount path, the tools
bundle where the init container puts it (pd_operator.serving_image.bundle), POD_IP
127.0.0.1 (the downward API), free ports instead of 8090 (both pods share one network here),
`--peer 127.0.0.1:<port>` for the prefill pod's DNS name, a 1 s period instead of 30 s, and a plain
GET of the rendered readinessProbe path standing in for the kubelet.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from pd_operator.controller import links
from pd_operator.controller.proxy_state import ProxyStateReader
from pd_operator.controller.status import Observed, conditions, status
from pd_operator.names import Names
from pd_operator.proxy.membership import parse_document
from pd_operator.render import render
from pd_operator.render.proxy import membership_document
from support.cluster import pick_port, wait_for
from support.controller_fakes import desired, link_down, pods_of, routable_of, validated, with_figures
from support.kv_probe import Sidecar, kubelet_ready
from support.renders import config_map_data, role_of, serving_sets
from support.specs import example

pytestmark = pytest.mark.transfer

GATE_TIMEOUT = 120.0  # generous upper bound for a state change on a loaded machine


def decoder_hosts(validation, pods: list[dict]) -> list[str]:
    """The proxy's decode upstreams as the operator computes them (its membership ConfigMap)."""
    routable, _ = routable_of(validation, pods)
    routes = parse_document(membership_document(validation.resolved, routable))
    return [str(urlsplit(u.url).hostname) for u in routes.decode]


def test_decode_is_routed_only_over_a_working_kv_link(tmp_path):
    validation = validated(example())  # GLM-5.3-Flash, prefill TP8 (blocks of 640) -> decode DP2xTP4 (1152)
    manifests = render(validation.resolved)
    mounted = tmp_path / "etc-pd"
    mounted.mkdir()
    for key, text in config_map_data(manifests).items():
        (mounted / key).write_text(text)
    sets = {role_of(s): s for s in serving_sets(manifests)}
    probe_cont, gate_cont = (sets[r]["spec"]["template"]["spec"]["containers"][1]
                             for r in ("prefill", "decode"))
    assert (probe_cont["name"], gate_cont["name"]) == ("kv-probe", "kv-link")

    probe_port, gate_port = pick_port(), pick_port()

    def as_in_cluster(round_: dict) -> dict:
        """The round as a gate in the cluster prints it: the peer by the prefill pod's DNS name (the
        config's peers), where here `--peer` named 127.0.0.1."""
        peer = f"{Names('glm-flash', 'default').pod_host('prefill', 0, 0)}:8090"
        return {**round_, "peers": [{**p, "peer": peer} for p in round_["peers"]]}

    prefill = Sidecar(probe_cont, mounted, probe_port)
    gate = Sidecar(gate_cont, mounted, gate_port, ["--peer", f"127.0.0.1:{probe_port}"])
    try:
        children = desired(validation)
        pods = pods_of(children)  # every container ready, as once the engines have loaded
        names = Names("glm-flash", "default")

        wait_for("the decode gate to go ready", lambda: kubelet_ready(gate_cont, gate_port), GATE_TIMEOUT)
        last = ProxyStateReader().gate("127.0.0.1", gate_port).round  # as the operator reads it
        assert last is not None and last["ok"]
        (pair,) = last["peers"]
        assert pair["errors"] == [] and pair["bytes"] > 0 and pair["gbps"] > 0
        assert decoder_hosts(validation, pods) == [names.pod_host("decode", 0, 0)]
        linked = links.link_status(validation.resolved, pods, [], lambda pod: as_in_cluster(last))
        assert [(e["prefill"], e["linked"]) for e in linked] == [("glm-flash-prefill-0", True)]
        assert linked[0]["latencyMs"] == pair["latencyMs"] > 0 and linked[0]["gbps"] == pair["gbps"] > 0

        prefill.stop()
        wait_for("the gate to go not ready", lambda: not kubelet_ready(gate_cont, gate_port), GATE_TIMEOUT)
        down = [link_down(p) if "decode" in p["metadata"]["name"] else p for p in pods]
        assert decoder_hosts(validation, down) == []  # the only decode instance left the upstreams
        body = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{gate_port}/link", timeout=10).read())
        assert not body["ok"] and "cannot fetch the descriptor" in body["peers"][0]["errors"][0]
        unlinked = links.link_status(validation.resolved, down, linked, lambda pod: as_in_cluster(body))
        observed = with_figures(validation, Observed(children=children, pods=down, links=unlinked))
        got = {c["type"]: (c["status"], c["reason"]) for c in conditions(validation, observed, [], 1, "t")}
        assert got["DecodeReady"] == ("False", "KVLinkNotReady")
        (entry,) = status(validation, observed, {}, 1, "t")["kvLinks"]
        assert not entry["linked"] and "cannot fetch the descriptor" in entry["message"]
    finally:
        for sidecar in (gate, prefill):
            if sidecar.proc.poll() is None:
                sidecar.stop()
