"""The properties every render must have, checked on the examples and on generated specs.

The kv-transfer-config rules mirror vLLM's KVTransferConfig (vllm-project/vllm:
vllm/config/kv_transfer.py @ v0.34.0: known fields only, producer/consumer role, integer port, a
connector and an engine id, recompute|fail) and vllm-ascend's extra-config check (vllm_ascend/utils.py
check_kv_extra_config @ v0.30.0rc2) (prefill/decode tp_size and dp_size equal to the real
shapes, decode pp_size 1). `test_vllm_accepts.py` runs vLLM's own code on the same configs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import kubernetes_validate

from pd_operator.api.schema_check import schema_problems
from pd_operator.api.types import ROLE_KIND, PDRole
from pd_operator.names import Names
from pd_operator.proxy.membership import KEY, MOUNT_DIR, Upstream
from pd_operator.render.env import ENGINE_API_KEY_ENV
from pd_operator.serving_image import bundle
from pd_operator.spec.ports import PROBE_PORT, pod_ports
from pd_operator.spec.reserved import OWNED_ENV
from pd_operator.spec.validate import Validation
from support.renders import container, flag, of_kind, pod_argvs, proxy_membership, role_of, serving_sets

KV_TRANSFER_FIELDS = {
    "kv_connector", "engine_id", "kv_buffer_device", "kv_buffer_size", "kv_role", "kv_rank",
    "kv_parallel_size", "kv_ip", "kv_port", "kv_connector_extra_config", "kv_connector_module_path",
    "enable_permute_local_kv", "kv_load_failure_policy"}
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}


def check_schemas(manifests: list[dict]) -> None:
    for m in manifests:
        if m["kind"] == ROLE_KIND:  # our own kind: against our CRD, as the API server checks it
            assert schema_problems(m, PDRole) == [], m
        else:
            kubernetes_validate.validate(m, "1.33", strict=True)


def check_kv_transfer_config(config: dict, role: str, validation: Validation) -> None:
    spec = validation.deployment.spec
    assert set(config) <= KV_TRANSFER_FIELDS, set(config) - KV_TRANSFER_FIELDS
    assert config["kv_role"] == KV_ROLE[role]
    assert config["kv_connector"] == spec.kv_transfer.connector
    assert isinstance(config["kv_port"], str) and int(config["kv_port"]) == spec.kv_transfer.kv_port
    assert config["engine_id"]
    assert config.get("kv_load_failure_policy", "recompute") in ("recompute", "fail")
    assert config.get("kv_load_failure_policy") == spec.kv_transfer.load_failure_policy
    extra = config["kv_connector_extra_config"]
    for side in ("prefill", "decode"):
        shape = getattr(spec, side)
        assert extra[side]["tp_size"] == shape.tensor_parallel_size
        assert extra[side]["dp_size"] == shape.data_parallel_size
    assert extra["decode"].get("pp_size", 1) == 1
    assert extra["prefill"].get("pp_size", 1) == spec.prefill.pipeline_parallel_size


def _plan_ports(validation: Validation, role: str) -> set[int]:
    spec, plan = validation.deployment.spec, validation.shapes[role]
    return {p for o in range(plan.pods)
            for r in pod_ports(spec.kv_transfer.kv_port, spec.serving_port, plan, o)
            for p in range(r.start, r.end)}


def check_pods(validation: Validation, manifests: list[dict], work: Path) -> None:
    dep = validation.deployment
    names = Names(dep.name, dep.namespace)
    engine_ids = []
    for sts, ordinal, argv in pod_argvs(manifests, work):
        role, plan = role_of(sts), validation.shapes[role_of(sts)]
        index = int(sts["metadata"]["labels"]["pd.serving.dev/instance"])
        side = dep.role(role)
        layout = validation.report.prefill_layout if role == "prefill" else validation.report.decode_layout
        assert argv[:3] == ["vllm", "serve", dep.spec.model.name]
        assert flag(argv, "--block-size") == str(layout.engine_block_size)
        assert flag(argv, "--tensor-parallel-size") == str(side.tensor_parallel_size)
        assert flag(argv, "--data-parallel-size") == str(side.data_parallel_size)
        assert flag(argv, "--port") == str(dep.spec.serving_port)
        if plan.multi_pod:
            assert flag(argv, "--data-parallel-start-rank") == str(plan.start_rank(ordinal))
            assert flag(argv, "--data-parallel-address") == names.pod_host(role, index, 0)
            assert ("--headless" in argv) == (ordinal > 0)
        else:
            assert "--headless" not in argv and "--data-parallel-start-rank" not in argv
        config = json.loads(flag(argv, "--kv-transfer-config"))
        check_kv_transfer_config(config, role, validation)
        if ordinal == 0:
            engine_ids.append(config["engine_id"])
    assert len(engine_ids) == len(set(engine_ids)) == sum(dep.role(r).replicas for r in ("prefill", "decode"))


def check_containers(validation: Validation, manifests: list[dict]) -> None:
    kv_hashes = set()
    for sts in serving_sets(manifests):
        role = role_of(sts)
        pod = sts["spec"]["template"]["spec"]
        cont = container(sts)
        # Every serving pod runs its side of the KV-link probe (kv_probe.py).
        (sidecar,) = pod["containers"][1:]
        assert sidecar["name"] == {"prefill": "kv-probe", "decode": "kv-link"}[role]
        assert sidecar["command"][:3] == [*bundle.command("pd-kv-probe"),
                                          {"prefill": "serve", "decode": "gate"}[role]]
        # Both run the tools bundle the operator image's init container copies in (render/tools.py),
        # read-only, with the serving image's python3: nothing of ours needs to be in that image.
        # Then the serving image reports what its vllm-ascend is, as its termination message.
        init, report = pod["initContainers"]
        assert init["image"] == validation.resolved.tools_image
        assert init["command"] == [bundle.COMMAND, bundle.MOUNT]
        assert report["name"] == "pd-image-report"
        assert report["command"] == [*bundle.command("pd-preflight"), "--report",
                                     report["terminationMessagePath"]]
        for c in (cont, sidecar, report):
            assert c["image"] == validation.deployment.spec.image.name
            assert {"name": init["volumeMounts"][0]["name"], "mountPath": bundle.MOUNT,
                    "readOnly": True} in c["volumeMounts"]
        served = {p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
        assert served == _plan_ports(validation, role) and PROBE_PORT in served
        names = [e["name"] for e in cont["env"]]
        assert not [n for n, c in Counter(names).items() if c > 1], names
        owned = {n for n in names if n in OWNED_ENV}
        keyless = validation.deployment.spec.proxy.api_key is None  # the engines' key: with one only
        assert set(OWNED_ENV) - ({ENGINE_API_KEY_ENV} if keyless else set()) == owned
        npus = validation.shapes[role].npus_per_pod
        npu = validation.deployment.role(role).npu_resource_name
        assert cont["resources"]["limits"][npu] == cont["resources"]["requests"][npu] == npus
        assert not cont["securityContext"]["privileged"]
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        kv_hashes.add(labels["pd.serving.dev/kv-layout"])
    if serving_sets(manifests):
        assert len(kv_hashes) == 1, kv_hashes


def check_proxy(validation: Validation, manifests: list[dict]) -> None:
    dep = validation.deployment
    deployments = [d for d in of_kind(manifests, "Deployment") if role_of(d) == "proxy"]
    names = Names(dep.name, dep.namespace)
    if not dep.spec.proxy.enabled:
        assert not deployments
        assert not [m for m in of_kind(manifests, "ConfigMap")
                    if m["metadata"]["name"] == names.proxy_membership]
        return
    (proxy,) = deployments
    cont = container(proxy)
    assert cont["command"][0] == "pd-proxy"
    # The proxy runs from the operator image, never the serving one, unless the spec names another.
    assert cont["image"] == (dep.spec.proxy.image or validation.resolved.tools_image)
    assert flag(cont["command"], "--membership") == f"{MOUNT_DIR}/{KEY}"
    assert flag(cont["command"], "--port") == str(dep.spec.proxy.port)
    (mount,) = cont["volumeMounts"]
    assert mount["mountPath"] == MOUNT_DIR and "subPath" not in mount  # a subPath is never updated
    (volume,) = [v for v in proxy["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == names.proxy_membership
    routing = dep.spec.proxy.routing
    assert flag(cont["command"], "--prefix-routing") == routing.prefix
    routed = proxy_membership(manifests)
    for role in ("prefill", "decode"):
        # Prefix routing hashes a prefill's prompts in its resolved prefix-cache block, and only there.
        block = (validation.resolved.prefix_hit_tokens(role)
                 if role == "prefill" and routing.prefix != "off" else None)
        assert routed.role(role) == tuple(
            Upstream(names.instance(role, i), f"http://{names.pod_host(role, i, 0)}:{dep.spec.serving_port}",
                     validation.resolved.layout_hash, block, routing.prefill_cache_blocks if block else None)
            for i in range(dep.role(role).replicas))


def check_all(validation: Validation, manifests: list[dict], work: Path) -> None:
    check_schemas(manifests)
    check_pods(validation, manifests, work)
    check_containers(validation, manifests)
    check_proxy(validation, manifests)
