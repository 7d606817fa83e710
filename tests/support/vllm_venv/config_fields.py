"""Run inside `.vllm-venv`: the config class vLLM 0.34 builds for each model_type, introspected.

Reads {"modelTypes": [...], "citations": [[model_type, key, path], ...], "ascendSrc": DIR (optional: install
vllm-ascend's GLM-5.3-Flash config classes from its source first)} as JSON on stdin and prints
{"classes": {model_type: {"class", "module", "fields", "defaults"}}, "citations": [[model_type, key, path,
found]]}:
- the class is the one `vllm/transformers_utils/config.py` resolves (its own registry, else transformers'
  AutoConfig mapping), or its text sub-config where it nests one (`get_text_config`, Glm5NextConfig);
- `fields` are the keys it reads from config.json: its dataclass fields and `__init__` parameters, and the
  keys its `__post_init__`/`__init__` take out of `kwargs` (Qwen3NextConfig's `full_attention_interval`,
  Glm5NextTextConfig's `linear_attn_config`);
- `defaults` are the values a config without any key gets (`cls()`, or the literal default of a `kwargs`
  key), for the JSON-representable ones;
- a citation `[model_type, key, path]` (a key vLLM's model code reads off a config that is not one of the
  class's fields) is found when that vLLM source file reads `config.<key>` or names `"<key>"`.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import json
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def config_class(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    cls = _CONFIG_REGISTRY[model_type] if model_type in _CONFIG_REGISTRY else CONFIG_MAPPING[model_type]
    text = getattr(cls, "sub_configs", {}).get("text_config")
    return text if isinstance(text, type) else cls


def kwargs_reads(cls) -> list[tuple[str, str]]:
    """(key, the literal default or "") of every `kwargs.get/pop("key"...)` in the class's init hooks."""
    found = []
    for hook in ("__post_init__", "__init__"):
        try:
            source = inspect.getsource(getattr(cls, hook))
        except (OSError, TypeError):
            continue
        found += re.findall(r'kwargs\.(?:get|pop)\(\s*"(\w+)"\s*(?:,\s*([^()]+?)\s*)?\)', source)
    return found


def fields(cls) -> list[str]:
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    names |= {n for n, p in inspect.signature(cls.__init__).parameters.items()
              if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return sorted(names | {key for key, _ in kwargs_reads(cls)})


def defaults(cls) -> dict:
    """A key's value on `cls()`; for a key taken out of `kwargs` (no attribute), the literal default of
    that `kwargs.get/pop`."""
    instance = cls()
    out = {}
    for key, literal in kwargs_reads(cls):
        with contextlib.suppress(ValueError, SyntaxError):
            out[key] = ast.literal_eval(literal)
    for key in fields(cls):
        value = getattr(instance, key, None)
        if hasattr(instance, key) and isinstance(value, (int, float, str, bool, list, dict, type(None))):
            out[key] = value
    return out


def main() -> None:
    import vllm

    request = json.loads(sys.stdin.read())
    if request.get("ascendSrc"):
        from block_alignment import install_glm5next_config  # this directory's probe

        install_glm5next_config(Path(request["ascendSrc"]))
    classes = {}
    for model_type in request["modelTypes"]:
        cls = config_class(model_type)
        classes[model_type] = {"class": cls.__name__, "module": cls.__module__, "fields": fields(cls),
                               "defaults": defaults(cls)}
    root = Path(vllm.__file__).parent.parent
    citations = []
    for model_type, key, path in request["citations"]:
        source = (root / path).read_text() if (root / path).is_file() else ""
        found = bool(re.search(rf'config\.{key}\b|"{key}"', source))
        citations.append([model_type, key, path, found])
    print(json.dumps({"classes": classes, "citations": citations}))


if __name__ == "__main__":
    main()
