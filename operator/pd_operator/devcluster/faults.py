"""Deterministic fault injection for the HTTP side of the emulated API server.

The fault tier of the test suite needs to see how the operator copes with a flaky API server:
5xx answers, write conflicts, expired watches, slow answers and dropped connections. Faults are
drawn from a seeded RNG so a failing run can be replayed, and only ever hit HTTP requests to
resource endpoints -- never discovery, and never the direct store API that tests use to assert.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections import Counter
from collections.abc import Iterable

KINDS = frozenset({"500", "409", "410", "slow", "drop"})
VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete"})


@dataclasses.dataclass(frozen=True)
class _Config:
    rate: float
    kinds: tuple[str, ...]
    verbs: frozenset[str] | None
    resources: frozenset[str] | None
    delay_s: float


class FaultInjector:
    """``configure()`` arms it, ``off()`` disarms it, ``injected`` counts what was injected by kind.

    ``configure()`` replaces the previous configuration and re-seeds the RNG; the counters keep
    accumulating until cleared (``faults.injected.clear()``). A request that matches gets a fault
    with probability ``rate``, its kind drawn uniformly among the configured kinds that apply
    ("410" applies to watches only).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._config: _Config | None = None
        self._rng = random.Random(0)
        self.injected: Counter[str] = Counter()

    def configure(
        self,
        rate: float = 0.0,
        kinds: Iterable[str] = ("500",),
        verbs: Iterable[str] | None = None,
        resources: Iterable[str] | None = None,
        seed: int = 0,
        delay_s: float = 0.0,
    ) -> None:
        kinds = tuple(sorted(set(kinds)))
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be within [0, 1], got {rate}")
        if unknown := set(kinds) - KINDS:
            raise ValueError(f"unknown fault kinds: {sorted(unknown)}")
        if verbs is not None and (unknown := set(verbs) - VERBS):
            raise ValueError(f"unknown verbs: {sorted(unknown)}")
        with self._lock:
            self._config = _Config(
                rate,
                kinds,
                None if verbs is None else frozenset(verbs),
                None if resources is None else frozenset(resources),
                delay_s,
            )
            self._rng = random.Random(seed)

    def off(self) -> None:
        with self._lock:
            self._config = None

    @property
    def delay_s(self) -> float:
        config = self._config
        return config.delay_s if config else 0.0

    def draw(self, verb: str, plural: str) -> str | None:
        """The fault to inject into this request, if any (and count it)."""
        with self._lock:
            config = self._config
            if config is None or config.rate <= 0.0:
                return None
            if config.verbs is not None and verb not in config.verbs:
                return None
            if config.resources is not None and plural not in config.resources:
                return None
            applicable = [k for k in config.kinds if k != "410" or verb == "watch"]
            if not applicable or self._rng.random() >= config.rate:
                return None
            kind = self._rng.choice(applicable)
            self.injected[kind] += 1
            return kind
