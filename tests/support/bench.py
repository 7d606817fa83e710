"""What every bench/*.py script shares, so that a test can hold each to what it documents.

A bench's docstring lists its figures under a `Figures:` line, one `- name: meaning` line each,
and that list is the one home for them: `report` refuses to print a different set, and the smoke
test (tests/bench/test_bench.py) runs every bench with `--quick` and checks each listed figure comes
out as a number. `--quick` keeps a bench's real code path at small sizes and one repetition: it
checks that the bench runs; its figures mean little.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from support.cluster import DEFAULT_NODES, ControlPlane
from support.installed import Release, helm_install, helm_uninstall
from support.podnet import loopback

HEADER = "Figures:"
_ITEM = re.compile(r"- (\w+): \S")


def documented(doc: str) -> list[str]:
    """The figure names listed under the docstring's `Figures:` line (up to the first other line)."""
    lines = doc.splitlines()
    if HEADER not in (line.strip() for line in lines):
        raise ValueError(f"the docstring has no {HEADER!r} list")
    start = [line.strip() for line in lines].index(HEADER) + 1
    names = []
    for line in lines[start:]:
        item = _ITEM.match(line.strip())
        if item is None:
            if line.startswith((" ", "\t")) and names:
                continue  # an item's meaning wrapped onto an indented line
            break
        names.append(item.group(1))
    if not names:
        raise ValueError(f"the docstring's {HEADER!r} list is empty")
    return names


def parser(doc: str, repetitions: tuple[int, str] | None = None) -> argparse.ArgumentParser:
    """An argument parser for a bench with its docstring's first line and `--quick`, and with
    `--repetitions` when given as (default, what one repetition is)."""
    out = argparse.ArgumentParser(description=doc.splitlines()[0])
    out.add_argument("--quick", action="store_true",
                     help="small sizes, one repetition: checks that the bench runs (tests/bench)")
    if repetitions:
        default, what = repetitions
        out.add_argument("--repetitions", type=int, default=default, help=f"{what} (default {default})")
    return out


KEEP_ENV = "PD_BENCH_KEEP"
"""Set to a directory: a bench's work directory (logs of the control plane, the operator, the pods'
processes) is made under it and kept, to read after a surprising figure."""


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[pathlib.Path]:
    """A bench's work directory: removed afterwards unless PD_BENCH_KEEP names where to keep it."""
    if keep := os.environ.get(KEEP_ENV):
        pathlib.Path(keep).mkdir(parents=True, exist_ok=True)
        kept = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=keep))
        print(f"# work directory kept: {kept}")
        yield kept
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield pathlib.Path(tmp)


def exit_code(failed: Sequence[str]) -> int:
    """A bench under load ends 1 when a request failed, after showing the first failures."""
    for failure in failed[:10]:
        print(f"  {failure}", file=sys.stderr)
    return 1 if failed else 0


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None, quick: Mapping[str, Any]
          ) -> argparse.Namespace:
    """The arguments, with `quick` as the defaults under `--quick` (flags given still win)."""
    args = parser.parse_args(argv)
    if unknown := set(quick) - set(vars(args)):
        raise ValueError(f"quick settings for no argument: {sorted(unknown)}")
    if args.quick:
        parser.set_defaults(**quick)
        args = parser.parse_args(argv)
    return args


def report(doc: str, figures: Mapping[str, object]) -> None:
    """Print `name: value` for every figure, in the docstring's order; a figure printed but not
    documented, or documented but not printed, is the bench's bug and stops it."""
    names = documented(doc)
    if set(names) != set(figures):
        raise SystemExit(f"bench figures differ from its docstring: undocumented "
                         f"{sorted(set(figures) - set(names))}, missing {sorted(set(names) - set(figures))}")
    for name in names:
        print(f"{name}: {figures[name]}")


@contextlib.contextmanager
def operator_plane(workdir: pathlib.Path) -> Iterator[tuple[ControlPlane, Release]]:
    """(control plane, release): a control plane whose kwok pods get loopback IPs (support/podnet.py),
    the chart installed and its operator running with the webhook configured; uninstalled after.
    What the benches that run pods under load (scale.py, rollout.py) start from."""
    with ControlPlane(nodes=[loopback(DEFAULT_NODES[0])]) as cp:
        release = helm_install(cp, workdir)
        try:
            with release.operator(cp, workdir) as op:
                op.wait_health(lambda h: h.get("webhook", {}).get("ok") is True, "the webhook configured")
                yield cp, release
        finally:
            helm_uninstall(cp, release)
