"""Manifests as YAML text, the way a person reads them: fields in rendered order, multi-line
strings (the Mooncake config, the probe script) as literal blocks instead of escaped quotes."""

from __future__ import annotations

import yaml


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(manifests: list[dict]) -> str:
    return yaml.dump_all(manifests, Dumper=_Dumper, sort_keys=False, width=110)
