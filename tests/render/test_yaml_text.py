"""`pdctl render`'s YAML text keeps every string a string for any reader: PyYAML (YAML 1.1), a YAML 1.2
core-schema reader and kubectl's go-yaml. A revision or layout hash is 10 hex digits, so about one in a
hundred is all digits with a leading zero (`0569510914`) or digits with one `e` (`1234567e12`): PyYAML
writes both plain, kubectl reads them as numbers (render/yaml_text.py)."""

from __future__ import annotations

import dataclasses
import random
import re

import pytest
import yaml

from pd_operator.api.labels import KV_LAYOUT, REVISION
from pd_operator.render import render, workloads
from pd_operator.render.runnable import check
from pd_operator.render.yaml_text import to_yaml
from support.renders import VALID_EXAMPLES
from support.specs import example

GLM = next(p for p in VALID_EXAMPLES if p.stem == "glm-5.3-flash-1p1d-tp4")
RISKY = ["0569510914", "0123456789", "1234567890", "0000000000", "1234567e12", "0e12345678", "12345e6789",
         "1e10000000", "0x1f2e3d4c", "y", "n", "on", "No", "null", "~", ".5", "1_000"]
"""Hand-picked: a leading zero, all digits, one `e`, other numbers, and 1.1 booleans and nulls."""

# The YAML 1.2 core schema's tag resolution (yaml.org: YAML 1.2.2 spec, 10.3.2), as the spec's table
# states it: a plain scalar matching one of these is not a string.
CORE_1_2 = [re.compile(p) for p in (
    r"null|Null|NULL|~|", r"true|True|TRUE|false|False|FALSE",
    r"[-+]?[0-9]+", r"0o[0-7]+", r"0x[0-9a-fA-F]+",
    r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?", r"[-+]?(\.inf|\.Inf|\.INF)",
    r"\.nan|\.NaN|\.NAN")]
BOOL_1_1 = re.compile(r"y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF")
"""The YAML 1.1 boolean type in full (yaml.org: type/bool.html), which go-yaml v2 reads and PyYAML's
resolver reads without `y` and `n`."""
STR = "tag:yaml.org,2002:str"


def plain_strings(text: str) -> list[str]:
    """Every plain (unquoted, not block) scalar of `text` that PyYAML, a YAML 1.1 reader, reads as a
    string."""
    out = []
    for document in yaml.compose_all(text):
        stack = [document]
        while stack:
            node = stack.pop()
            if isinstance(node, yaml.ScalarNode):
                if node.style is None and node.tag == STR:
                    out.append(node.value)
            elif isinstance(node, yaml.SequenceNode):
                stack += node.value
            elif isinstance(node, yaml.MappingNode):
                stack += [n for pair in node.value for n in pair]
    return out


def misread(text: str) -> list[str]:
    """Strings of `text` another reader takes as another type: those written plain that the full YAML
    1.1 booleans or the YAML 1.2 core schema read as a boolean, null or number. (What PyYAML itself
    reads as another type shows in the round trip.)"""
    return [v for v in plain_strings(text) if BOOL_1_1.fullmatch(v) or any(p.fullmatch(v) for p in CORE_1_2)]


def generated_hashes(count: int, seed: int = 30) -> list[str]:
    """`count` hashes as revisions are (10 hex digits), a third of them drawn from digits and `e` alone
    so the risky kinds come often."""
    rng = random.Random(seed)
    alphabets = ("0123456789abcdef", "0123456789", "0123456789e")
    return ["".join(rng.choice(alphabets[i % 3]) for _ in range(10)) for i in range(count)]


def test_the_check_sees_what_a_plain_hash_would_be():
    assert sorted(misread("a: 0569510914\nb: 1234567e12\nc: 'x'\nd: abc\ne: 12\n")) == ["0569510914",
                                                                                       "1234567e12"]
    assert misread("a: y\nb: '0569510914'\nc: true\n") == ["y"]


@pytest.mark.parametrize("value", [*RISKY, *generated_hashes(1000)])
def test_every_string_reads_back_a_string(value):
    manifest = {"metadata": {"labels": {REVISION: value, KV_LAYOUT: value}, "name": value}, "data": [value]}
    text = to_yaml([manifest])
    assert not misread(text), text
    assert yaml.safe_load(text) == manifest


@pytest.mark.parametrize("value", RISKY[:8])
def test_a_rendered_deployment_with_a_risky_revision_and_layout_hash(value, monkeypatch):
    """The GLM example rendered as `pdctl render` renders it, its revisions and kv-layout hash forced to
    a risky value: every string in the text reads back as the same string."""
    monkeypatch.setattr(workloads, "revision", lambda template: value)
    resolved = check(example(GLM)).validation.resolved
    assert resolved is not None
    resolved = dataclasses.replace(resolved, layout_hash=value)
    manifests = render(resolved, rendered=workloads.templates(resolved))
    text = to_yaml(manifests)
    assert not misread(text)
    assert list(yaml.safe_load_all(text)) == manifests
    assert f"{REVISION}: '{value}'" in text and f"{KV_LAYOUT}: '{value}'" in text
