"""The operator in a background thread of this process, for the demo, the benchmark and tests.

It is the same `main.run` as `pd-operator run`; `stop()` ends it the way SIGTERM would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from pd_operator.controller.main import Options, run
from pd_operator.localnet import free_port

START_TIMEOUT_S = 20.0


class BackgroundOperator:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="pd-operator", daemon=True)

    def _main(self) -> None:
        try:
            run(self.options, stop_flag=self.stop_flag, ready_flag=self.ready_flag)
        except BaseException as err:  # reported by start() and stop()
            self.error = err

    def start(self) -> BackgroundOperator:
        self.thread.start()
        if not self.ready_flag.wait(START_TIMEOUT_S):
            raise RuntimeError(f"the operator did not start: {self.error!r}")
        return self

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(timeout=START_TIMEOUT_S)
        if self.thread.is_alive():
            raise RuntimeError("the operator did not stop")
        if self.error is not None:
            raise RuntimeError(f"the operator failed: {self.error!r}") from self.error

    def __enter__(self) -> BackgroundOperator:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def local_options(kubeconfig: str, **overrides: Any) -> Options:
    """Options for an operator next to a local (emulated or test) cluster: no webhook unless asked,
    health and metrics on free loopback ports."""
    return Options(**{"kubeconfig": kubeconfig, "webhook": False, "health_port": free_port(),
                      "metrics_port": free_port(), **overrides})


@contextmanager
def operators(kubeconfig: str) -> Iterator[Callable[..., BackgroundOperator]]:
    """Start operators against one cluster as needed (`start(**overrides)`); on exit every one
    still running is stopped, and any that failed raises."""
    started: list[BackgroundOperator] = []

    def start(**overrides: Any) -> BackgroundOperator:
        op = BackgroundOperator(local_options(kubeconfig, **overrides)).start()
        started.append(op)
        return op

    yield start
    for op in started:
        if op.thread.is_alive():
            op.stop()
        assert op.error is None, repr(op.error)
