"""The operator in a background thread of this process, for the demo, the benchmark and tests.

It is the same `main.run` as `pd-operator run`; `stop()` ends it the way SIGTERM would.
"""

from __future__ import annotations

import threading
from types import TracebackType

from pd_operator.controller.main import Options, run

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
