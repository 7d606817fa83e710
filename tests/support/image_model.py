"""A directory that runs like an image of the model (pd_operator.serving_image.contents) on this
machine: a `bin` with only the image's commands, and a python3 that imports only the image's packages.

So a test that runs a rendered container command here (support.renders.run_pod) fails as the image
would when the command needs something the image lacks, rather than finding it in the developer's
venv: `python3` is this venv's interpreter with `-S` (no site-packages, no .pth files, so not the
editable pd_operator) and PYTHONPATH naming links to exactly the model's packages (and what they
depend on, by their distributions' metadata); `vllm` is the recorder; `sh` is /bin/sh. Commands of
ours (pd-proxy, ...) are not offered: the `images` tier runs those in the images themselves.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path

from pd_operator.serving_image.contents import Contents

RECORDER = Path(__file__).with_name("recorder.py")
# Modules of the model that are not importable packages here: vllm is the recorder command, and
# vllm_ascend is the stand-in tree the caller lays out.
NOT_LINKED = frozenset({"vllm", "vllm_ascend"})


def _distribution_closure(modules: set[str]) -> set[str]:
    """The distributions providing `modules` and everything they require (no extras)."""
    providers = metadata.packages_distributions()
    pending = [d for m in modules for d in providers.get(m, [])]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        pending += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
    return seen


def _top_levels(distributions: set[str]) -> set[str]:
    providers = metadata.packages_distributions()
    return {top for top, dists in providers.items()
            if any(re.sub(r"[-_.]+", "-", d).lower() in distributions for d in dists)}


def lay_out(image: Contents, dest: Path) -> tuple[Path, Path]:
    """(bin, site) under dest for `image`; put `bin` alone on PATH and `site` first on PYTHONPATH."""
    wanted = set(image.modules) - NOT_LINKED
    missing = [m for m in wanted if importlib.util.find_spec(m) is None]
    assert not missing, f"this venv lacks {missing} of the image's model (make install)"
    bin_dir, site = dest / "bin", dest / "site"
    shutil.rmtree(dest, ignore_errors=True)
    bin_dir.mkdir(parents=True)
    site.mkdir()
    for top in _top_levels(_distribution_closure(wanted)):
        spec = importlib.util.find_spec(top)
        if spec is None or spec.origin in (None, "built-in", "frozen"):
            continue
        path = Path(spec.origin)
        source = path.parent if path.name == "__init__.py" else path
        (site / source.name).symlink_to(source)
    commands = {"python3": f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n"}
    for name, text in commands.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    if "vllm" in image.commands:
        shutil.copy(RECORDER, bin_dir / "vllm")  # `#!/usr/bin/env python3`: the python3 above
    if "sh" in image.commands:
        (bin_dir / "sh").symlink_to("/bin/sh")
    return bin_dir, site


def path_env(bin_dir: Path, *pythonpath: Path) -> dict[str, str]:
    """PATH and PYTHONPATH of a process run as in the image."""
    return {"PATH": str(bin_dir), "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath)}
