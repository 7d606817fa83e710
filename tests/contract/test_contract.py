"""The contract tier: what the operator renders, checked against vllm-ascend's released source and
the Mooncake libraries its images install, at every release pd_operator.serving_image.capabilities knows.

Covered: every kv_connector we render is registered by that release's connector registry (and its
module defines the class); every environment variable the operator sets is read by something in
the image (support/env_readers.py); the units of the timeout variables; pd-proxy's prefill request against the
example proxy's own builder, and its routes; the image capability table (connectors, GLM-Next model
code, the default model runner, no released seed change) and the place the preflight looks for the
seed's function; the connector's Mooncake metadata mode and transport against the KV-link probe's.
Not covered: anything that needs an NPU or torch_npu (vllm-ascend cannot be imported here), the
seed change's own source (no snapshot of PR #16755 exists here; images/vllm-ascend checks it at
build time), HCCL/torch_npu reading their variables (only that vllm-ascend's guides set them).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import re
import types
from pathlib import Path

import mooncake
import pytest

from pd_operator.api.types import KVTransferSpec, TimeoutSpec
from pd_operator.kv.compat import V1_MIXED_STATE_ERRORS
from pd_operator.proxy import protocol
from pd_operator.proxy.server import Proxy
from pd_operator.render import render
from pd_operator.render.runnable import validate
from pd_operator.serving_image.capabilities import GLM_NEXT, PD_CONNECTORS, RELEASES, capabilities
from pd_operator.serving_image.installed import introspect, module_path, registered_connectors
from pd_operator.spec.reserved import DEFAULT_ENV, OWNED_ENV
from pd_operator.transfer.engine import P2P
from support import upstream
from support.env_readers import NATIVE_READERS, Readers, pod_reads, unread
from support.renders import VALID_EXAMPLES, container, pod_argvs, rendered, serving_sets
from support.specs import EXAMPLES, ROOT, example

pytestmark = pytest.mark.contract

VLLM_ENVS = next((ROOT / ".vllm-venv").glob("lib/python3*/site-packages/vllm/envs.py"), None)
# Upstream unit of each timeout variable the operator renders. Mooncake's Ascend transport reads
# ASCEND_CONNECT_TIMEOUT and ASCEND_TRANSFER_TIMEOUT in milliseconds (Mooncake:
# mooncake-transfer-engine/src/transport/ascend_transport/ascend_direct_transport, default 3000);
# test_transfer_timeout_is_milliseconds shows it from vllm-ascend's own fallback value.
# VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT is compared with time.time() differences: seconds.
UNITS = {"ASCEND_TRANSFER_TIMEOUT": "ms", "ASCEND_CONNECT_TIMEOUT": "ms",
         "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT": "s"}
GLM_EXAMPLE = EXAMPLES / "glm-5.3-flash-tp8-dp2tp4.yaml"


# --- the capability table -----------------------------------------------------------------------

def test_every_release_the_operator_knows_is_pinned_here():
    assert set(upstream.VLLM_ASCEND_ARCHIVES) == set(RELEASES)


def test_capability_table_matches_the_source(version, source):
    found = introspect(source, commit_file=source / "no-commit-file")
    release = RELEASES[version]
    assert found.version == version
    assert {c for c in found.connectors if c in PD_CONNECTORS} == release.connectors
    assert found.families == release.families
    assert not found.seed_change, f"vllm-ascend {version} carries the seed: the table must say so"


PLATFORM_PATCHES = Path("vllm_ascend/patch/platform")


def defined_names(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}


def test_kv_cache_dtypes_and_block_rule_match_the_source(version, source):
    """int8: a platform patch widens vLLM's CacheDType with it and the patch package imports it.
    The block rule pd_operator.kv plans (0.30.0rc2's): patch_mamba_config.py packs a C8 MLA page
    (`_using_sparse_sfa_c8`) and has no state-aligned rule for other hybrid models (whose assertion
    reads 'Cannot align ssm_page_size and attn_page_size')."""
    release = RELEASES[version]
    widen = source / PLATFORM_PATCHES / "patch_kv_cache_dtype.py"
    imported = "patch_kv_cache_dtype" in (source / PLATFORM_PATCHES / "__init__.py").read_text()
    widens = widen.is_file() and imported and '"int8"' in widen.read_text()
    assert widens == release.int8_kv_cache, f"vllm-ascend {version}: int8 KV cache is {widens} in the source"
    mamba = source / PLATFORM_PATCHES / "patch_mamba_config.py"
    text = mamba.read_text()
    modelled = ("_using_sparse_sfa_c8" in defined_names(mamba)
                and "Cannot align ssm_page_size and attn_page_size" not in text)
    assert modelled == release.block_rule_modelled, \
        f"vllm-ascend {version}: the planned block rule is {'' if modelled else 'not '}its own"


def test_prefix_caching_ties_the_state_block_and_v2_finds_it_by_position(version, source):
    """What kv/blocksize.py plans for prefix caching on a hybrid model holds in every release: the config
    hook sets the state block to the engine block in align mode, and MooncakeConnectorV2's pull worker (where
    the release has it) takes the last prompt state block of both sides' tables whatever their mode, while V1
    fails on mixed modes with the errors PrefixCachingModeMismatch quotes."""
    hook = " ".join((source / PLATFORM_PATCHES / "patch_mamba_config.py").read_text().split())
    assert ('if cache_config.enable_prefix_caching and cache_config.mamba_cache_mode == "align": '
            "cache_config.mamba_block_size = cache_config.block_size") in hook, version
    if GLM_NEXT not in RELEASES[version].families:  # serves no hybrid model (ImageLacksModel, ...Unmodelled)
        return
    # V1 reads the remote state block by its own mode: the words kv/compat.py quotes for mixed modes.
    v1 = (source / "vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py").read_text()
    assert all(message in v1 for message in V1_MIXED_STATE_ERRORS.values()), version
    worker = " ".join((source / "vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake/pull_worker.py")
                      .read_text().split())
    assert ("elif isinstance(spec, MambaSpec): "
            "local_kernel_block_ids = [local_group_block_ids[-self.num_speculative_tokens - 1]] "
            "remote_kernel_block_ids = [remote_group_block_ids[-1]]") in worker, version


def test_connector_modules_define_the_registered_classes(version, source):
    """The registry entries the preflight and the table rely on point at real classes (or aliases)."""
    for name, (module, cls) in registered_connectors(source).items():
        if name not in PD_CONNECTORS:
            continue
        path = module_path(source, module)
        tree = ast.parse(path.read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        defined |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Name)}
        assert cls in defined, f"{name}: {module} defines no {cls}"


def test_the_preflight_looks_for_the_seed_where_released_cross_block_pairing_lives(version, source):
    """The seed's _compute_cross_tp_runs replaces the kernel-block assertion of MooncakeConnectorV2's
    pull worker; serving_image.installed searches that connector's package, so it must hold the
    assertion today."""
    connectors = registered_connectors(source)
    if "MooncakeConnectorV2" not in connectors:  # nothing to look in; the table must agree
        assert "MooncakeConnectorV2" not in RELEASES[version].connectors
        return
    package = module_path(source, connectors["MooncakeConnectorV2"][0]).parent
    assert any("does not support different local and remote kernel block size" in p.read_text()
               for p in package.rglob("*.py"))


def test_default_model_runner_is_v1_and_glm_next_runs_there(version, source):
    """Unset VLLM_USE_V2_MODEL_RUNNER means Model Runner V1 on Ascend, and a release's GLM-5.3-Flash
    guide (where it names the runner) uses V1; the table renders V1 for GLM-Next without the seed."""
    patch = source / "vllm_ascend/patch/platform/patch_use_v2_model_runner.py"
    function = next(n for n in ast.walk(ast.parse(patch.read_text()))
                    if isinstance(n, ast.FunctionDef) and n.name == "_patched_use_v2_model_runner")
    final = function.body[-1]
    assert isinstance(final, ast.Return) and isinstance(final.value, ast.Constant) \
        and final.value.value is False, "the runner default when the variable is unset"
    caps = capabilities(f"quay.io/ascend/vllm-ascend:v{version}")
    assert caps is not None and not caps.runs_on_model_runner_v2(GLM_NEXT)
    guide = source / "docs/source/tutorials/models/GLM5.3-Flash.md"
    if GLM_NEXT in RELEASES[version].families and guide.exists():
        assert set(re.findall(r"VLLM_USE_V2_MODEL_RUNNER=(\d)", guide.read_text())) <= {"0"}


# --- kv_connector ---------------------------------------------------------------------------------

def rendered_connectors(tmp_path: Path) -> dict[str, set[str]]:
    """vllm-ascend release -> kv_connector values the examples' pods really start with."""
    out: dict[str, set[str]] = {}
    for path in VALID_EXAMPLES:
        image = example(path)["spec"]["image"]
        caps = capabilities(image["name"], image.get("vllmAscendVersion"), image.get("seedChange"))
        assert caps is not None
        for _, _, argv in pod_argvs(rendered(path), tmp_path / path.stem):
            kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
            out.setdefault(caps.vllm_ascend_version, set()).add(kv["kv_connector"])
    return out


def test_rendered_connectors_are_registered_by_the_image_release(tmp_path):
    by_release = rendered_connectors(tmp_path)
    assert by_release
    for version, connectors in by_release.items():
        registered = registered_connectors(upstream.fetch(version))
        assert connectors <= set(registered), \
            f"vllm-ascend {version} does not register {connectors - set(registered)}"


def test_every_connector_the_spec_offers_is_a_pd_connector_some_release_registers():
    offered = set(KVTransferSpec.model_fields["connector"].annotation.__args__)  # type: ignore[union-attr]
    assert offered == set(PD_CONNECTORS)
    for connector in offered:
        assert any(connector in registered_connectors(upstream.fetch(v)) for v in RELEASES)


# --- environment ---------------------------------------------------------------------------------

def serving_containers() -> list[dict]:
    return [container(sts) for path in VALID_EXAMPLES for sts in serving_sets(rendered(path))]


def operator_env_names() -> list[str]:
    """Every variable the operator sets on a serving container: owned, defaults and what the examples
    render (user env from the examples' specs excluded)."""
    user = {e["name"] for path in VALID_EXAMPLES for role in ("prefill", "decode")
            for e in example(path)["spec"][role].get("env", [])}
    names = dict.fromkeys([*OWNED_ENV, *DEFAULT_ENV])
    for cont in serving_containers():
        names.update(dict.fromkeys(e["name"] for e in cont["env"] if e["name"] not in user))
    return list(names)


def pod_scripts() -> str:
    """The rendered serving pods' commands and probes, where the pod itself reads variables."""
    parts = []
    for cont in serving_containers():
        parts += [json.dumps(cont.get("command", [])), json.dumps(cont.get("args", []))]
        parts += [json.dumps(cont.get(p, {})) for p in ("readinessProbe", "livenessProbe", "startupProbe")]
    return "\n".join(parts)


def mooncake_tag(source: Path) -> str:
    """The mooncake-transfer-engine-npu version a release's image installs (its Dockerfile)."""
    match = re.search(r"^ARG MOONCAKE_TAG=(\S+)", (source / "Dockerfile").read_text(), re.M)
    assert match, "the release's Dockerfile pins no MOONCAKE_TAG"
    return match.group(1)


@pytest.fixture(scope="session")
def image_readers(version, source) -> Readers:
    assert VLLM_ENVS is not None, "vLLM's envs.py: run `make vllm-env`"
    tag = mooncake_tag(source)
    assert tag in upstream.MOONCAKE_NPU_WHEELS, f"pin mooncake-transfer-engine-npu {tag} in upstream.py"
    packages = [upstream.fetch_mooncake(tag) / "mooncake", Path(mooncake.__file__).parent]
    return Readers.of(source, packages, VLLM_ENVS, pod_scripts())


def test_every_variable_the_operator_sets_is_read_in_the_image(version, image_readers):
    names = operator_env_names()
    assert "ASCEND_TRANSFER_TIMEOUT" in names and "VLLM_USE_V2_MODEL_RUNNER" in names
    assert unread(names, image_readers) == [], f"vllm-ascend {version} image reads none of these"


def test_the_checker_catches_a_renamed_variable(image_readers):
    """A rendered env with one name changed, as a careless edit of render/env.py would produce."""
    renamed = {"ASCEND_TRANSFER_TIMEOUT": "ASCEND_TRANSFER_TIMEOUT_MS", "VLLM_HOST_IP": "VLLM_HOST_ADDR",
               "MC_MIN_RPC_PORT": "MOONCAKE_MIN_RPC_PORT"}
    env = next(names for cont in serving_containers()
               if set(renamed) <= set(names := [e["name"] for e in cont["env"]]))
    assert unread(env, image_readers) == []
    mutated = [renamed.get(name, name) for name in env]
    assert unread(mutated, image_readers) == [n for n in mutated if n in renamed.values()]


def test_pod_reads_finds_shell_and_python_reads():
    assert pod_reads('sh -c "x=$PD_POD_INDEX ${MY_VAR}" os.environ["A_B"] os.getenv("C_D")') == \
        {"PD_POD_INDEX", "MY_VAR", "A_B", "C_D"}
    assert NATIVE_READERS.keys() <= set(DEFAULT_ENV) | set(OWNED_ENV)


# --- units ------------------------------------------------------------------------------------------

def _function(path: Path, name: str) -> types.FunctionType:
    """One top-level function of an upstream file, compiled alone (its module needs torch_npu)."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict = {"os": __import__("os")}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def test_transfer_timeout_is_milliseconds(version, source, monkeypatch):
    """vllm-ascend writes ASCEND_TRANSFER_TIMEOUT for Mooncake when unset: HCCL's RDMA retransmit
    time (4.096 us x 2^HCCL_RDMA_TIMEOUT x HCCL_RDMA_RETRY_CNT) / 1000, plus Mooncake's 3000 default.
    Microseconds / 1000 is milliseconds; an explicit value is passed through unchanged."""
    utils = source / "vllm_ascend/distributed/kv_transfer/utils/utils.py"
    get = _function(utils, "get_transfer_timeout_value")
    for name in ("ASCEND_TRANSFER_TIMEOUT", "HCCL_RDMA_TIMEOUT", "HCCL_RDMA_RETRY_CNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HCCL_RDMA_TIMEOUT", "20")
    monkeypatch.setenv("HCCL_RDMA_RETRY_CNT", "7")
    retransmit_ms = 4.096e-6 * 2**20 * 7 * 1000
    assert abs(get() - (retransmit_ms + 3000)) <= 1
    monkeypatch.setenv("ASCEND_TRANSFER_TIMEOUT", "12345")
    assert get() == 12345


def test_abort_timeout_is_seconds(source):
    variable = "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"
    uses = [p for p in source.joinpath("vllm_ascend").rglob("*.py")
            if "- delay_start_time" in (text := p.read_text()) and variable in text]
    assert uses
    for path in uses:
        assert re.search(r"current_time = time\.(time|monotonic|perf_counter)\(\)", path.read_text()), path


def _unit_of_field(name: str) -> str:
    if name.endswith("_seconds"):
        return "s"
    if name.endswith(("_ms", "_milliseconds")):
        return "ms"
    raise AssertionError(f"TimeoutSpec.{name} does not say its unit")


def rendered_timeouts(**timeouts: int) -> dict[str, str]:
    doc = example(GLM_EXAMPLE)
    fields = TimeoutSpec.model_fields
    doc["spec"]["kvTransfer"]["timeouts"] = {fields[k].alias: v for k, v in timeouts.items()}
    validation = validate(doc)
    assert validation.ok, validation.errors
    sts = serving_sets(render(validation.resolved))[0]
    return {e["name"]: e.get("value", "") for e in container(sts)["env"]}


def test_timeouts_are_rendered_in_the_unit_upstream_reads():
    """Each TimeoutSpec field is set alone to a distinctive value; the variable it moves must carry
    that duration in the unit upstream reads it in (UNITS)."""
    baseline = rendered_timeouts()
    for name in TimeoutSpec.model_fields:
        value = 7 if _unit_of_field(name) == "s" else 7000  # 7 seconds either way
        env = rendered_timeouts(**{name: value})
        moved = {k: v for k, v in env.items() if baseline.get(k) != v}
        assert len(moved) == 1, f"TimeoutSpec.{name} moves {sorted(moved)}"
        ((variable, got),) = moved.items()
        assert variable in UNITS, f"{variable} has no known upstream unit"
        want = 7 if UNITS[variable] == "s" else 7000
        assert got == str(want), (f"spec.kvTransfer.timeouts.{TimeoutSpec.model_fields[name].alias}="
                                  f"{value} renders {variable}={got}, which upstream reads as {got} "
                                  f"{UNITS[variable]}; 7 s is {want}")


# --- the proxy ---------------------------------------------------------------------------------------

EXAMPLE_PROXY = "examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py"
# The membership endpoints pd-proxy replaces with its mounted file (pd_operator/proxy/__init__.py).
MEMBERSHIP_ROUTES = {"/instances/add", "/instances/remove"}
ADMIN_ROUTES = {"/reset_prefix_cache"}
CLIENT_BODIES = [
    {"model": "m", "prompt": "hi", "max_tokens": 64, "stream": True,
     "stream_options": {"include_usage": True}},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 64,
     "min_tokens": 8, "temperature": 0.5, "kv_transfer_params": {"from": "the client"}},
    {"model": "m", "prompt": [1, 2, 3]},
]


def test_pd_proxy_speaks_the_example_proxys_protocol(version, source):
    """pd-proxy asks prefill exactly what vllm-ascend's example proxy asks (its own
    `build_prefill_request`, run from the release's source), and serves every route the example
    serves but the membership ones (/reset_prefix_cache on its admin port)."""
    script = source / EXAMPLE_PROXY
    assert script.is_file(), f"vllm-ascend {version} has no {EXAMPLE_PROXY}"
    tree = ast.parse(script.read_text())
    (builder,) = [n for n in tree.body
                  if isinstance(n, ast.FunctionDef) and n.name == "build_prefill_request"]
    namespace: dict = {}
    exec(compile(ast.Module(body=[builder], type_ignores=[]), str(script), "exec"), namespace)
    for body in CLIENT_BODIES:
        assert protocol.prefill_request(copy.deepcopy(body)) == namespace["build_prefill_request"](
            copy.deepcopy(body)), body
    routes = {d.args[0].value for n in tree.body if isinstance(n, ast.AsyncFunctionDef)
              for d in n.decorator_list if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
              and d.func.attr in ("get", "post") and d.args and isinstance(d.args[0], ast.Constant)}
    assert {"/v1/completions", "/v1/chat/completions", "/healthcheck"} <= routes
    proxy = Proxy(Path("unused"))
    clients, admin = ({r.resource.canonical for r in app.router.routes() if r.resource}
                      for app in (proxy.app(), proxy.admin_app()))
    ours = clients | admin
    assert routes - MEMBERSHIP_ROUTES <= ours, f"pd-proxy lacks {routes - MEMBERSHIP_ROUTES - ours}"
    # What acts on every engine is on the admin port only (pd_operator/proxy/server.py).
    assert admin >= ADMIN_ROUTES and not ADMIN_ROUTES & clients


def test_the_cached_archives_are_the_pinned_bytes():
    for version, digest in upstream.VLLM_ASCEND_ARCHIVES.items():
        upstream.fetch(version)
        archive = upstream.CACHE / f"vllm_ascend-{version}.tar.gz"
        assert hashlib.sha256(archive.read_bytes()).hexdigest() == digest


# --- the KV-link gate against the connector's engine -------------------------------------------

ENGINE_INIT = re.compile(r"\.initialize\(\s*\w+\s*,\s*\"(\w+)\"\s*,\s*\"(\w+)\"\s*,")


def test_the_gate_shares_the_connectors_metadata_mode_not_its_transport(version, source):
    """vllm-ascend's PD connectors open Mooncake with P2P handshakes on the `ascend` transport
    (vllm_ascend/distributed/kv_transfer/utils/mooncake_transfer_engine.py); the probe opens it with
    the same metadata mode on `tcp` (transfer/engine.py). docs/architecture.md says what a passing
    gate therefore proves; this pins both facts per release, so a connector that changed its mode or
    transport fails here first."""
    text = (source / "vllm_ascend/distributed/kv_transfer/utils/mooncake_transfer_engine.py").read_text()
    assert ENGINE_INIT.findall(text) == [(P2P, "ascend")]
    probe = (ROOT / "operator/pd_operator/transfer/engine.py").read_text()
    assert 'protocol: str = "tcp"' in probe


def test_the_npu_wheel_ascend_transport_needs_an_npu_context(version, source):
    """The Mooncake NPU wheel a release's image installs carries the `ascend` transport as a library
    that sets an NPU device through AscendCL: a container without an NPU (the probe sidecar: the
    device plugin gives the NPUs to the engine container) cannot open it."""
    wheel = upstream.fetch_mooncake(mooncake_tag(source)) / "mooncake"
    library = (wheel / "ascend_transport.so").read_bytes()
    assert b"aclrtSetDevice" in library
