"""vLLM's own parser confirms the override rule: every spelling in support.owned_flags really sets the
owned value (so refusing it is needed), and no option of `vllm serve` that the operator does not
own is refused by the prefix rule (so refusing prefixes costs a user nothing)."""

from __future__ import annotations

import json
import subprocess

import pytest

from pd_operator.render import render
from pd_operator.spec.reserved import OWNED_FLAGS, owned_flag
from support.owned_flags import FREE_ARGS, VALUES, spellings
from support.renders import VALID_EXAMPLES, serving_argv, serving_sets
from support.specs import ROOT, example, resolve

pytestmark = pytest.mark.vllm

VLLM_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"
CHECKER = ROOT / "tests" / "support" / "vllm_venv" / "owned_flags.py"


def run_vllm(argvs: list[list[str]]) -> dict:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm-env` to install vLLM's config code")
    proc = subprocess.run([str(VLLM_PYTHON), str(CHECKER)], input=json.dumps({"argvs": argvs}),
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "VLLM_TARGET_DEVICE": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def parsed():
    doc = example(next(p for p in VALID_EXAMPLES if p.stem == "glm-5.3-flash-1p1d-tp4"))
    (decode,) = [s for s in serving_sets(render(resolve(doc))) if "decode" in s["metadata"]["name"]]
    base = serving_argv(decode)
    cases = [words for flag in sorted(VALUES) for words in spellings(flag)]
    result = run_vllm([base, *([*base, *w] for w in cases), *([*base, *w] for w in FREE_ARGS)])
    rendered, *rest = result["parsed"]
    assert rendered["ok"], rendered["error"]
    return {"rendered": rendered["values"], "cases": list(zip(cases, rest[:len(cases)], strict=True)),
            "free": list(zip(FREE_ARGS, rest[len(cases):], strict=True)), "options": result["options"],
            "setting_owned": result["setting_owned"]}


def test_every_refused_spelling_that_vllm_accepts_changes_an_owned_value(parsed):
    accepted = 0
    for words, result in parsed["cases"]:
        if not result["ok"]:
            continue  # vLLM refuses it (an ambiguous prefix): no silent override either way
        accepted += 1
        changed = {k for k, v in result["values"].items() if v != parsed["rendered"][k]}
        assert changed, f"{words} is refused by the validator but changes nothing in vLLM"
    print(f"owned-flag spellings accepted by vLLM: {accepted} of {len(parsed['cases'])}")
    assert accepted >= len(OWNED_FLAGS) * 2, f"only {accepted} spellings accepted by vLLM"


def test_free_flags_leave_owned_values_alone(parsed):
    for words, result in parsed["free"]:
        assert result["ok"], f"{words}: {result['error']}"
        changed = {k for k, v in result["values"].items() if v != parsed["rendered"][k]}
        assert not changed, f"{words} changes {changed}"


def test_no_option_the_operator_does_not_own_is_refused(parsed):
    options = parsed["options"]
    owned_options = {o for o in options if o in OWNED_FLAGS}
    assert owned_options == set(OWNED_FLAGS), set(OWNED_FLAGS) - owned_options  # every owned flag exists
    wrongly = [o for o in options if o not in OWNED_FLAGS and owned_flag(o) is not None]
    assert not wrongly, f"options vLLM knows that the validator would refuse: {wrongly}"


def test_every_vllm_option_that_sets_an_owned_value_is_owned(parsed):
    # A new alias in a vLLM release (like -dpl for --data-parallel-size-local) must be added to
    # OWNED_FLAGS, or it slips past the validator.
    assert set(parsed["setting_owned"]) == set(OWNED_FLAGS), \
        set(parsed["setting_owned"]) ^ set(OWNED_FLAGS)
