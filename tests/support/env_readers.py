"""Who reads an environment variable in a serving image, judged from upstream's own files.

A rendered variable is honest when some program in the pod reads that exact name:
- vllm-ascend: its Python source names it as a string literal or an `envs.` attribute;
- Mooncake: its shared libraries carry the name as a string (how a C++ `getenv("NAME")` shows);
- vLLM: its `vllm/envs.py` declares it (vLLM 0.34, the version in .vllm-venv);
- a native library vllm-ascend configures through the environment (HCCL, torch_npu, gloo, OpenMP),
  which cannot be read here: then that vllm-ascend release's own deployment guides must `export` the
  exact name, so a misspelt or invented name still fails;
- this package: the rendered pod's own commands and probes read it (a shell `$NAME`, or
  `os.environ["NAME"]` in an inline script).
Nothing is imported or executed here; the readers are built from files on disk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# Variables read by native libraries rather than by Python or Mooncake code -> that library.
NATIVE_READERS: dict[str, str] = {
    "HCCL_IF_IP": "HCCL (CANN)",
    "HCCL_SOCKET_IFNAME": "HCCL (CANN)",
    "HCCL_BUFFSIZE": "HCCL (CANN)",
    "GLOO_SOCKET_IFNAME": "torch.distributed (gloo)",
    "TP_SOCKET_IFNAME": "torch.distributed (tensorpipe)",
    "PYTORCH_NPU_ALLOC_CONF": "torch_npu",
    "OMP_NUM_THREADS": "OpenMP",
}
_PRINTABLE = re.compile(rb"[\x20-\x7e]{4,}")


def library_strings(package: Path) -> set[str]:
    """Every printable run of 4+ bytes in the shared libraries under `package` (like `strings`)."""
    out: set[str] = set()
    for path in package.rglob("*.so*"):
        out.update(m.decode() for m in _PRINTABLE.findall(path.read_bytes()))
    return out


def _python_names(root: Path) -> set[str]:
    """Upper-case names that appear as string literals or attributes in Python files under root."""
    out: set[str] = set()
    pattern = re.compile(r"""["']([A-Z][A-Z0-9_]{2,})["']|\.([A-Z][A-Z0-9_]{2,})\b""")
    for path in root.rglob("*.py"):
        for quoted, attr in pattern.findall(path.read_text(errors="replace")):
            out.add(quoted or attr)
    return out


def _exported(docs: Path) -> set[str]:
    """Names the guides set for a process: `export NAME=` lines and `NAME=value` env entries."""
    out: set[str] = set()
    pattern = re.compile(r"(?:export\s+|^\s*-?\s*)([A-Z][A-Z0-9_]{2,})=", re.M)
    for path in docs.rglob("*.md"):
        out.update(pattern.findall(path.read_text(errors="replace")))
    return out


@dataclass
class Readers:
    """The names each reader of one serving image knows."""

    vllm_ascend: set[str] = field(default_factory=set)
    mooncake: set[str] = field(default_factory=set)
    vllm: set[str] = field(default_factory=set)
    guides: set[str] = field(default_factory=set)
    this_package: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, vllm_ascend_source: Path, mooncake_packages: list[Path], vllm_envs: Path,
           pod_scripts: str) -> Readers:
        return cls(vllm_ascend=_python_names(vllm_ascend_source / "vllm_ascend"),
                   mooncake=set().union(*(library_strings(p) for p in mooncake_packages)),
                   vllm=set(re.findall(r'"([A-Z][A-Z0-9_]+)":\s*lambda', vllm_envs.read_text())),
                   guides=_exported(vllm_ascend_source / "docs"),
                   this_package=pod_reads(pod_scripts))

    def reader(self, name: str) -> str | None:
        """Which reader reads `name`, or None when nothing in the image does."""
        if name in self.mooncake:
            return "mooncake"
        if name in self.vllm_ascend:
            return "vllm-ascend"
        if name in self.vllm:
            return "vllm"
        if name in NATIVE_READERS and name in self.guides:
            return f"{NATIVE_READERS[name]} (set by vllm-ascend's guides)"
        if name in self.this_package:
            return "pd-operator"
        return None


def pod_reads(scripts: str) -> set[str]:
    """Names the rendered commands and probes read: `$NAME`, `${NAME}`, `environ["NAME"]`, getenv."""
    pattern = re.compile(r"""\$\{?([A-Z][A-Z0-9_]+)|environ(?:\.get\(|\[)\s*["']([A-Z][A-Z0-9_]+)"""
                         r"""|getenv\(\s*["']([A-Z][A-Z0-9_]+)""")
    return {g for groups in pattern.findall(scripts) for g in groups if g}


def unread(names: list[str], readers: Readers) -> list[str]:
    """The names no reader of the image reads, in the given order."""
    return [n for n in names if readers.reader(n) is None]
