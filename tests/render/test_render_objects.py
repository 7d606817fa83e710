"""Labels and the kv-layout hash, the policy objects, the probes as they would run in a pod, and
the property checks themselves (they must catch a broken render)."""

from __future__ import annotations

import copy
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from urllib.parse import urlsplit

import pytest

from pd_operator.render import render, workloads
from pd_operator.render.command import CONFIG_DIR
from pd_operator.render.runnable import validate
from support.render_properties import check_all
from support.renders import (
    VALID_EXAMPLES,
    config_map_data,
    container,
    of_kind,
    pod_env,
    proxy_membership,
    role_of,
    serving_sets,
)
from support.specs import example, resolve

GLM = next(p for p in VALID_EXAMPLES if p.stem == "glm-5.3-flash-tp8-dp2tp4")
MULTI_POD = next(p for p in VALID_EXAMPLES if p.stem.startswith("deepseek"))


def layout_hash(doc: dict) -> str:
    return resolve(doc).layout_hash


def changed(path: str, value) -> dict:
    doc = example(GLM)
    *parents, leaf = path.split(".")
    node = doc
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return doc


def test_kv_layout_hash_is_on_both_roles_and_follows_what_must_match():
    base = layout_hash(example(GLM))
    manifests = render(resolve(example(GLM)))
    for obj in [*serving_sets(manifests), *of_kind(manifests, "Service")[:2]]:
        assert obj["metadata"]["labels"]["pd.serving.dev/kv-layout"] == base
    assert layout_hash(changed("spec.prefill.blockSize", 1280)) != base      # engine block 640 -> 1280
    rebuilt = "registry.example.com/pd-operator/pd-vllm-ascend:v0.30.0rc2-seed-b"
    assert layout_hash(changed("spec.image.name", rebuilt)) != base
    assert layout_hash(changed("spec.image.seedChange", False)) != base   # GLM-Next back on Model Runner V1
    # The same layout written differently, or a change that does not touch the layout, keeps it.
    assert layout_hash(changed("spec.model.kvCacheDtype", "bfloat16")) == base
    assert layout_hash(changed("spec.decode.replicas", 3)) == base
    # Prefix caching: MooncakeConnectorV2 pairs either mode, so the hash leaves it out ...
    assert layout_hash(changed("spec.prefill.enablePrefixCaching", False)) == base


def test_kv_layout_hash_keys_the_state_mode_where_the_connector_needs_it_equal():
    """MooncakeConnectorV1 with speculative tokens finds the state block by its own mode (kv/compat.py), so an
    old and a new instance that differ in prefix caching must not pair during a rollout."""
    def v1_mtp(caching: bool) -> dict:
        doc = example(GLM)
        doc["spec"]["kvTransfer"]["connector"] = "MooncakeConnectorV1"
        for role in ("prefill", "decode"):
            doc["spec"][role].update(numSpeculativeTokens=1, enablePrefixCaching=caching, kernelBlockSize=128)
        return doc
    assert layout_hash(v1_mtp(True)) != layout_hash(v1_mtp(False))


def prefill_revision(doc: dict) -> str:
    return workloads.templates(resolve(doc)).revisions["prefill"]


def test_a_prefill_side_change_rolls_prefill():
    assert prefill_revision(changed("spec.prefill.blockSize", 1280)) != prefill_revision(example(GLM))


def test_labels_and_selectors():
    manifests = render(resolve(example(GLM)))
    for m in manifests:
        labels = m["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "pd-operator"
        assert labels["app.kubernetes.io/instance"] == labels["pd.serving.dev/deployment"] == "glm-flash"
        assert "ownerReferences" not in m["metadata"]  # the controller adopts
        assert m["metadata"]["namespace"] == "default"
    for sts in serving_sets(manifests):
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == labels["pd.serving.dev/role"]
        # Selectors are immutable, so the layout hash (which changes with the image) is not in them.
        assert "pd.serving.dev/kv-layout" not in sts["spec"]["selector"]["matchLabels"]
    policy, proxy_policy = of_kind(manifests, "NetworkPolicy")
    engines, proxies, probe = policy["spec"]["ingress"]  # no scraper unless the operator names one
    assert engines["from"][0]["podSelector"]["matchLabels"]["pd.serving.dev/deployment"] == "glm-flash"
    assert proxies["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert proxies["from"][0]["podSelector"]["matchLabels"]["pd.serving.dev/role"] == "proxy"
    assert probe["ports"] == [{"protocol": "TCP", "port": 8090}]
    assert proxy_policy["spec"]["podSelector"]["matchLabels"]["pd.serving.dev/role"] == "proxy"
    clients, admin = proxy_policy["spec"]["ingress"]
    assert clients == {"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 8000}]}
    operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pd-system"}}}
    assert admin == {"from": [operator], "ports": [{"protocol": "TCP", "port": 8001}]}
    budgets = of_kind(manifests, "PodDisruptionBudget")
    roles = [b["spec"]["selector"]["matchLabels"]["pd.serving.dev/role"] for b in budgets]
    assert roles == ["prefill", "decode"]


def test_apply_order():
    kinds = [m["kind"] for m in render(resolve(example(GLM)))]
    order = ["PDRole", "ConfigMap", "Service", "ServiceAccount", "Role", "RoleBinding", "StatefulSet",
             "Deployment", "NetworkPolicy", "PodDisruptionBudget"]
    assert [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k] == order


def test_owned_env_is_not_duplicated_by_user_defaults():
    doc = changed("spec.decode.env", [{"name": "OMP_NUM_THREADS", "value": "8"}])
    decode = container(serving_sets(render(resolve(doc)))[1])
    assert [e for e in decode["env"] if e["name"] == "OMP_NUM_THREADS"] == [
        {"name": "OMP_NUM_THREADS", "value": "8"}]


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's naming
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def _run_probe(cont: dict, ordinal: int, ports: dict[str, int]) -> int:
    command = [sys.executable if c == "python3" else c for c in cont["readinessProbe"]["exec"]["command"]]
    env = {**os.environ, **pod_env(cont, ordinal), "VLLM_HOST_IP": "127.0.0.1"}
    command = [ports.get(c, c) for c in command]
    return subprocess.run(command, env=env, capture_output=True, timeout=30).returncode


def test_multi_pod_probe_checks_http_on_the_leader_and_the_kv_port_elsewhere():
    sts = next(s for s in serving_sets(render(resolve(example(MULTI_POD)))) if s["spec"]["replicas"] > 1)
    cont = container(sts)
    http_port, kv_port = cont["readinessProbe"]["exec"]["command"][3:5]
    assert (http_port, kv_port) == ("8000", "36008")  # decode rank 2 (pod 1) of TP4: 36000 + 2 * 4
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        live = {http_port: str(server.server_port), kv_port: str(listener.getsockname()[1])}
        assert _run_probe(cont, 0, live) == 0
        assert _run_probe(cont, 1, live) == 0
        listener.close()
        server.shutdown()
        assert _run_probe(cont, 0, live) != 0
        assert _run_probe(cont, 1, live) != 0
    finally:
        listener.close()
        server.server_close()


def test_pods_of_a_multi_pod_instance_repel_each_other_and_keep_the_users_affinity():
    doc = example(MULTI_POD)
    node_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}
    doc["spec"]["decode"]["affinity"] = {"nodeAffinity": node_affinity}
    doc["spec"]["prefill"]["affinity"] = {"nodeAffinity": node_affinity}
    for sts in serving_sets(render(resolve(doc))):
        affinity = sts["spec"]["template"]["spec"]["affinity"]
        assert affinity["nodeAffinity"] == node_affinity
        labels = sts["spec"]["template"]["metadata"]["labels"]
        if sts["spec"]["replicas"] == 1:  # one pod per instance: nothing to keep apart
            assert "podAntiAffinity" not in affinity
            continue
        (term,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        selected = term["labelSelector"]["matchLabels"]
        assert selected.items() <= labels.items()  # it selects this instance's pods only
        assert {"pd.serving.dev/deployment", "pd.serving.dev/role", "pd.serving.dev/instance"} \
            <= set(selected)


BREAKAGES = {
    "decode tp_size in the extra config": lambda c: _edit_kv(c, lambda k: k["kv_connector_extra_config"]
                                                             ["decode"].update(tp_size=8)),
    "an unknown kv-transfer key": lambda c: _edit_kv(c, lambda k: k.update(kv_typo=1)),
    "a missing container port": lambda c: c["ports"].pop(),
    "a duplicated env var": lambda c: c["env"].append(dict(c["env"][0])),
    "a wrong block size": lambda c: c["command"].__setitem__(c["command"].index("--block-size") + 1, "128"),
}


def _edit_kv(cont: dict, change) -> None:
    i = cont["command"].index("--kv-transfer-config") + 1
    config = json.loads(cont["command"][i])
    change(config)
    cont["command"][i] = json.dumps(config)


@pytest.mark.parametrize("breakage", BREAKAGES, ids=str)
def test_checks_catch_a_broken_render(breakage, tmp_path):
    validation = validate(example(GLM))
    manifests = copy.deepcopy(render(validation.resolved))
    BREAKAGES[breakage](container(serving_sets(manifests)[1]))
    with pytest.raises(AssertionError):
        check_all(validation, manifests, tmp_path)


def test_probe_sidecars_read_the_pairing_the_engines_run(tmp_path):
    """Both probe sides rebuild, from the mounted pairing, the engine block sizes vLLM is given."""
    from pd_operator.transfer.probe import parser
    from pd_operator.transfer.probe_input import geometry

    for path in VALID_EXAMPLES:
        validation = validate(example(path))
        manifests = render(validation.resolved)
        for key, text in config_map_data(manifests).items():
            (tmp_path / key).write_text(text)
        for sts in serving_sets(manifests):
            (sidecar,) = sts["spec"]["template"]["spec"]["containers"][1:]
            args = parser().parse_args([a.replace(CONFIG_DIR, str(tmp_path)) for a in sidecar["command"][2:]])
            assert args.port == 8090 and args.command == {"prefill": "serve", "decode": "gate"}[role_of(sts)]
            geo = geometry(args)
            assert geo.prefill.engine_block_size == validation.report.prefill_layout.engine_block_size
            assert geo.decode.engine_block_size == validation.report.decode_layout.engine_block_size


def test_decode_gates_link_exactly_the_prefill_instances_the_proxy_routes_to(tmp_path):
    """The decode gate reads the proxy's membership (mounted where the proxy mounts it), so a prefill
    instance the membership does not list yet (not Ready after a scale-up) is no peer; without the
    proxy it links every prefill instance of the spec."""
    from pd_operator.proxy.membership import KEY, MOUNT_DIR, document
    from pd_operator.render.proxy import membership_data
    from pd_operator.render.serving_config import PEERS_DIR
    from pd_operator.spec.ports import PROBE_PORT
    from pd_operator.transfer.gate_state import Targets
    from pd_operator.transfer.probe import parser
    from pd_operator.transfer.probe_gate import prefill_peers, read_membership

    def gate_peers(sts: dict, manifests: list[dict]) -> list[str]:
        sidecar = sts["spec"]["template"]["spec"]["containers"][1]
        volumes = {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
        assert {m["name"] for m in sidecar["volumeMounts"]} <= volumes
        args = parser().parse_args([a.replace(MOUNT_DIR, str(tmp_path)) for a in sidecar["command"][2:]])
        if args.membership:
            assert MOUNT_DIR in {m["mountPath"] for m in sidecar["volumeMounts"]}
            targets = Targets(layout=args.layout)
            targets.file_read(read_membership(args.membership), 0.0)
            return list(targets.members().values())
        # Without the proxy: the peers ConfigMap, not the revision config (scaling is no new revision).
        assert args.peers_config == f"{PEERS_DIR}/pairing.json"
        assert PEERS_DIR in {m["mountPath"] for m in sidecar["volumeMounts"]}
        (peers,) = [m for m in of_kind(manifests, "ConfigMap")
                    if m["metadata"]["name"].endswith("-prefill-peers")]
        return list(prefill_peers(json.loads(peers["data"]["pairing.json"])).values())

    for path in VALID_EXAMPLES:
        doc = example(path)
        doc["spec"]["prefill"]["replicas"] = 2
        manifests = render(resolve(doc))
        assert "replicas" not in json.loads(config_map_data(manifests)["pairing.json"])["spec"]["prefill"]
        routes = proxy_membership(manifests)
        hosts = [f"{urlsplit(u.url).hostname}:{PROBE_PORT}" for u in routes.prefill]
        assert len(hosts) == 2
        every = document(list(routes.prefill), list(routes.decode))
        gated = document(list(routes.prefill[:1]), list(routes.decode))
        for members, want in ((every, hosts), (gated, hosts[:1])):
            (tmp_path / KEY).write_text(membership_data(members)[KEY])
            for sts in serving_sets(manifests):
                if role_of(sts) == "decode":
                    assert gate_peers(sts, manifests) == want, path

        doc["spec"]["proxy"] = {"enabled": False}
        bare = render(resolve(doc))
        for sts in serving_sets(bare):
            if role_of(sts) == "decode":
                assert gate_peers(sts, bare) == hosts, path
