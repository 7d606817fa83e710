"""Manifests as YAML text, the way a person reads them: fields in rendered order, multi-line
strings (the Mooncake config, the probe script) as literal blocks instead of escaped quotes.

Every string a YAML reader could take for another type is quoted. PyYAML quotes what its own YAML 1.1
resolver reads as a number, boolean or null, but kubectl reads YAML through go-yaml
(sigs.k8s.io/yaml), which also takes YAML 1.2 core numbers and Go's number forms: `0569510914` (a
revision hash; a leading zero that is no octal, parsed as a float) and `1234567e12` (an exponent
without a dot) are numbers there, and `y`/`n` booleans, while PyYAML writes them plain. So a
`pdctl render ... | kubectl apply -f -` would fail with "expected string" on such a label
(go.yaml.in/yaml/v2: resolve.go @ v2.4.3, `resolve` and `yamlStyleFloat`, as sigs.k8s.io/yaml
v1.6.0 uses it for k8s.io/apimachinery v0.36.3; yaml.org: YAML 1.2.2 spec, 10.3.2 core schema).
"""

from __future__ import annotations

import re

import yaml

OTHER_TYPE = re.compile(
    r"[-+]?(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|[0-9][0-9_]*"   # integers, any base
    r"|(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"      # floats, a dot or not
    r"|\.(?:inf|Inf|INF))"
    r"|\.(?:nan|NaN|NAN)"
    r"|[yYnN]|yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF"
    r"|null|Null|NULL|~|")
"""Plain scalars a YAML 1.1 or 1.2 reader, or go-yaml, may read as a number, a boolean or null."""


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text else "'" if OTHER_TYPE.fullmatch(text) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(manifests: list[dict]) -> str:
    return yaml.dump_all(manifests, Dumper=_Dumper, sort_keys=False, width=110)
