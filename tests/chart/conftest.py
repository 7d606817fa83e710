from __future__ import annotations

import pytest

from support.helm_chart import VALUE_SETS


@pytest.fixture(params=VALUE_SETS)
def value_set(request) -> str:
    """Each value set the chart is checked with: the defaults and every tests/chart/values/*.yaml."""
    return request.param
