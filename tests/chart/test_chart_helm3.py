"""The chart works unchanged with helm v3 (3.17, still the most deployed major): it lints, renders
exactly what helm v4 renders, and its schema refuses bad values there too."""

from __future__ import annotations

import json

import pytest
import yaml

from support.helm_chart import CHART, run_helm, stable, template, values_args


def test_helm3_is_really_helm3():
    assert run_helm("version", "--short", major=3).stdout.startswith("v3.")


def test_helm3_lint_strict(value_set):
    result = run_helm("lint", "--strict", str(CHART), *values_args(value_set), major=3)
    assert result.returncode == 0, result.stdout + result.stderr


def _documents(text: str) -> list[str]:
    # The majors order kinds unknown to them (cert-manager, monitoring) differently; compare as a set.
    return sorted(json.dumps(d, sort_keys=True) for d in yaml.safe_load_all(text) if d)


def test_helm3_renders_what_helm4_renders(value_set):
    v3 = template(*values_args(value_set), major=3)
    v4 = template(*values_args(value_set))
    assert v3.returncode == 0 and v4.returncode == 0, v3.stderr + v4.stderr
    assert _documents(stable(v3.stdout)) == _documents(stable(v4.stdout))


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("replicaCount=-1", "replicaCount"),
        ("webhook.failurePolicy=Sometimes", "webhook.failurePolicy"),
        ("replicas=2", "replicas"),
    ],
)
def test_helm3_schema_rejects_bad_value_naming_it(setting, named):
    result = template("--set", setting, major=3)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert named in result.stderr
