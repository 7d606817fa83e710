"""Our engine block sizes against vLLM 0.34's own hybrid unification, run in `.vllm-venv` on the same
config.json files (vllm_align_probe.py says exactly which vLLM objects are real).

Hybrids vLLM can resolve here: Qwen3-Next (dense attention + Gated DeltaNet) and Kimi Linear (MLA + KDA),
the latter also with GLM-5.3-Flash's shapes (NoPE MLA 512, KDA 64 heads x 128, conv 4). vLLM's own
Glm5NextForCausalLM cannot be resolved in the small recipe: its module imports the multimodal GLM-4.1V
code, which needs torchvision. Its state shapes come from the same KDA calculator the Kimi Linear class
uses (vllm: MambaStateShapeCalculator.kda_state_shape), so the GLM-shaped Kimi config exercises the
same unification inputs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pd_operator.kv import presets
from pd_operator.kv.blocksize import side_layout
from pd_operator.kv.hf_config import model_from_hf_config
from pd_operator.kv.side import Side

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"
HERE = Path(__file__).parent
CONFIGS = HERE / "hf_configs"

QWEN, KIMI, GLM_AS_KIMI = ("qwen3-next-80b-a3b-instruct", "kimi-linear-48b-a3b-instruct",
                           "glm-5.3-flash-as-kimi-linear")


def case(folder: str, tp: int, kernel: int = 128, block_size: int | None = None, spec: int = 0) -> dict:
    assert block_size is None or block_size % kernel == 0, "see vllm_align_probe.py: no layer rounding"
    return {"folder": str(CONFIGS / folder), "tp": tp, "kernel": kernel, "blockSize": block_size,
            "specTokens": spec}


CASES = [
    *(case(QWEN, tp) for tp in (1, 2, 4, 8, 16)),
    *(case(QWEN, tp, kernel) for tp in (1, 4) for kernel in (16, 64)),
    case(QWEN, 4, 16, block_size=1024),
    case(QWEN, 1, block_size=256),
    case(QWEN, 1, spec=2),
    *(case(KIMI, tp) for tp in (1, 2, 4, 8)),
    case(KIMI, 2, 64),
    case(KIMI, 1, spec=1),
    *(case(GLM_AS_KIMI, tp) for tp in (1, 2, 4, 8)),
    case(GLM_AS_KIMI, 1, spec=3),
    case(GLM_AS_KIMI, 8, block_size=512),
    case(GLM_AS_KIMI, 8, 16),
]


def case_id(c: dict) -> str:
    extras = "".join(f"-{key}{c[key]}" for key in ("blockSize", "specTokens") if c[key])
    return f"{Path(c['folder']).name}-tp{c['tp']}-k{c['kernel']}{extras}"


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"{VLLM_PYTHON} is absent; `make vllm-env` installs vLLM's config code")
    done = subprocess.run([str(VLLM_PYTHON), str(HERE / "vllm_align_probe.py"), json.dumps(CASES)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {case_id(row["case"]): row for row in rows}


def our_layout(c: dict):
    model = model_from_hf_config(json.loads((Path(c["folder"]) / "config.json").read_text()), "m")
    return side_layout(Side("prefill", model, c["tp"], block_size=c["blockSize"],
                            kernel_block_size=c["kernel"], num_speculative_tokens=c["specTokens"]))


@pytest.mark.parametrize("c", CASES, ids=case_id)
def test_block_size_matches_vllm(vllm_results, c):
    row = vllm_results[case_id(c)]
    assert "error" not in row, row["error"]
    ours = our_layout(c)
    assert ours.engine_block_size == row["block"]
    # vLLM pads the state page to one attention page unless they are already equal.
    assert row["paddedStatePage"] in (None, ours.main_page_bytes)
    (state,) = ours.state_groups
    assert state.slot_bytes == ours.main_page_bytes


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_vllm_agrees_with_the_glm_preset(vllm_results, tp):
    row = vllm_results[case_id(case(GLM_AS_KIMI, tp))]
    assert row["block"] == side_layout(Side("prefill", presets.get("glm-5.3-flash"), tp)).engine_block_size
    assert {1: 4352, 8: 640}.get(tp, row["block"]) == row["block"]  # the values reported upstream
