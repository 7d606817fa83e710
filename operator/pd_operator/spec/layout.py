"""The kv-layout hash: everything that must match between a prefill and a decode engine for a KV
pull to be correct, as one short value.

Every serving pod carries it as the label `pd.serving.dev/kv-layout` (api/labels.py), so the
controller and the proxy's gate can refuse to pair pods of different layouts (old prefill with new
decode in the middle of a rollout). Computed once per validation (spec/validate.py: Resolved).
"""

from __future__ import annotations

import hashlib
import json

from pd_operator.api.types import PDDeployment
from pd_operator.kv.blocksize import SideLayout
from pd_operator.kv.compat import state_modes_must_match
from pd_operator.kv.model import ModelKV
from pd_operator.serving_image import capabilities

HASH_CHARS = 12


def layout_hash(dep: PDDeployment, model: ModelKV, layouts: dict[str, SideLayout],
                caps: capabilities.ImageCapabilities) -> str:
    """`caps`: what spec.image can serve."""
    spec = dep.spec
    identity = {
        "model": model.name, "path": spec.model.name, "dtype": model.dtype,
        "kvCacheDtype": layouts["prefill"].side.cache_dtype,  # resolved: `auto` is the model dtype
        "blockSize": {role: layouts[role].engine_block_size for role in ("prefill", "decode")},
        "connector": spec.kv_transfer.connector,
        "image": spec.image.name,
        # The runner changes how blocks are handed to the connector (PR #16755), and spec.image can
        # change it (seedChange) without a new image name.
        "modelRunnerV2": capabilities.model_runner_env(caps, model),
    }
    prefill, decode = layouts["prefill"], layouts["decode"]
    if state_modes_must_match(spec.kv_transfer.connector, prefill.side, decode.side):
        # The connector finds the state block by its own cache mode (kv/compat.py): instances of an old and
        # a new spec that differ in it cannot pair. Keyed only there, so other layouts keep their hash.
        identity["mambaCacheMode"] = {role: layouts[role].mamba_cache_mode for role in ("prefill", "decode")}
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]
