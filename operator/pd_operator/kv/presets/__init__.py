"""Built-in model KV descriptions, one YAML file each, in the same form as `spec.model.kv`."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

import yaml

from pd_operator.kv.model import ModelKV

_SUFFIX = ".yaml"


def names() -> list[str]:
    return sorted(p.name[: -len(_SUFFIX)] for p in files(__package__).iterdir()
                  if p.name.endswith(_SUFFIX))


@cache
def get(name: str) -> ModelKV:
    if name not in names():
        raise KeyError(f"unknown model preset {name!r}; built-in presets: {', '.join(names())}")
    text = files(__package__).joinpath(name + _SUFFIX).read_text()
    return ModelKV.model_validate(yaml.safe_load(text))
