"""The serving image's added dependencies against its base, run in the build (see the Dockerfile):

  python3 base_lacks.py prune LOCK IN   keep in LOCK (a pip-compile --generate-hashes file) the entries
                                        IN pins and those whose distribution the base lacks, verbatim
  python3 base_lacks.py check LOCK      every installed distribution LOCK names has its requirements met

Installing the whole lock would move packages vLLM's set already holds (pyyaml, attrs,
python-dateutil, ...); installing by name would fetch them unhashed. So only what the base lacks is
installed, each file checked against the lock's hashes, and `check` then proves the base's copies of
the rest satisfy what was added. Runs on the base's Python, with the requirement parser of the pip
that runs the step (pip._vendor.packaging): the base need not have `packaging` itself.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def entries(lock_text: str) -> list[tuple[str, str]]:
    """(canonical name, the entry's text: requirement, hashes and `# via` lines) of each locked package."""
    out = []
    for block in re.split(r"\n(?=\S)", lock_text):
        if block.strip() and not block.startswith(("#", "-")):
            out.append((canonical(re.split(r"[=<>!~\[ ;]", block, maxsplit=1)[0]), block.rstrip("\n")))
    return out


def installed(name: str) -> str | None:
    try:
        return distribution(name).version
    except PackageNotFoundError:
        return None


def prune(lock: Path, pins: Path) -> None:
    wanted = {canonical(re.split(r"[=<>!~\[ ;]", line.strip(), maxsplit=1)[0])
              for line in pins.read_text().splitlines() if line.strip() and not line.startswith("#")}
    kept = [text for name, text in entries(lock.read_text()) if name in wanted or installed(name) is None]
    lock.write_text("\n".join(kept) + "\n")
    print(f"{lock}: installing {len(kept)} locked packages the base lacks or {pins.name} pins")


def check(lock: Path) -> int:
    from pip._vendor.packaging.requirements import Requirement

    problems = []
    for name, _ in entries(lock.read_text()):
        if installed(name) is None:
            continue
        for text in distribution(name).requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            have = installed(req.name)
            if have is None or not req.specifier.contains(have, prereleases=True):
                problems.append(f"{name} needs {req}; the image has {req.name} {have or 'not at all'}: "
                                f"pin a {name} the base satisfies, or pin {req.name} in "
                                "images/vllm-ascend/requirements.in to replace the base's (then images/lock.sh)")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "prune":
        prune(Path(argv[1]), Path(argv[2]))
        return 0
    if len(argv) == 2 and argv[0] == "check":
        return check(Path(argv[1]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
