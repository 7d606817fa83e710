"""The operator of the fault scenarios: the chart's command as its ServiceAccount, started and
killed as each scenario needs; the fleet and convergence helpers are tests/support/fleet.py."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator, Sequence

from support.cluster import ControlPlane, wait_for
from support.installed import OperatorProcess, Release


def _answers(op: OperatorProcess) -> bool:
    """/healthz answers (with --no-webhook kopf has no probe to report: `{}`)."""
    if not op.running():
        raise AssertionError(f"the operator exited:\n{op.output()[-3000:]}")
    op.health()
    return True


class Operators:
    """Operators of one release, started as the test asks (`start(...)`); at the end every one
    still running is stopped, and the test fails if one crashed by itself."""

    def __init__(self, cp: ControlPlane, release: Release, workdir: pathlib.Path) -> None:
        self.cp, self.release, self.workdir = cp, release, workdir
        self.started: list[OperatorProcess] = []
        self.killed: set[int] = set()

    def prepare(self, *, server: str | None = None, drift_interval_s: float | None = None,
                extra_args: Sequence[str] = ()) -> OperatorProcess:
        """The operator process, not started yet (`launch` it): hooks can name it first."""
        args = [*extra_args, *([f"--drift-interval={drift_interval_s}"] if drift_interval_s else [])]
        return self.release.operator(self.cp, self.workdir, server=server, extra_args=args)

    def launch(self, op: OperatorProcess) -> OperatorProcess:
        op.start()
        self.started.append(op)
        return op

    def start(self, *, server: str | None = None, drift_interval_s: float | None = None,
              extra_args: Sequence[str] = ()) -> OperatorProcess:
        """Start one and wait until its /healthz answers."""
        op = self.launch(self.prepare(server=server, drift_interval_s=drift_interval_s,
                                      extra_args=extra_args))
        wait_for("the operator's /healthz", lambda: _answers(op), 120)
        return op

    def kill(self, op: OperatorProcess) -> None:
        """SIGKILL, as the kubelet's OOM killer or a node loss would."""
        self.killed.add(id(op))
        op.kill()

    def finish(self) -> None:
        crashed = [op for op in self.started if id(op) not in self.killed and not op.running()]
        for op in self.started:
            op.stop()
        assert not crashed, f"the operator exited by itself:\n{crashed[0].output()[-4000:]}"


def operators(cp: ControlPlane, release: Release, workdir: pathlib.Path) -> Iterator[Operators]:
    ops = Operators(cp, release, workdir)
    try:
        yield ops
    finally:
        ops.finish()
