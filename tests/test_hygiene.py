"""Nothing half-merged lands: no tracked text file keeps a merge conflict's markers."""

from __future__ import annotations

import subprocess

from support.specs import ROOT

MARKERS = ("<<<<<<< ", "=======", ">>>>>>> ")


def test_no_tracked_file_keeps_merge_markers():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    assert files, "git ls-files listed nothing: not a checkout?"
    found = []
    for name in files:
        try:
            lines = (ROOT / name).read_text().splitlines()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary data, or deleted in the work tree
        found += [f"{name}:{n}" for n, line in enumerate(lines, 1)
                  if line.startswith(MARKERS[0]) or line.startswith(MARKERS[2]) or line == MARKERS[1]]
    assert not found, found
