"""Small stand-ins for a vllm-ascend source tree: the files pd_operator.serving_image.installed reads (the
connector registry, MooncakeConnectorV2's package, the GLM-Next model package, _version.py), written
here from scratch in the released layout, with or without the seed change's function."""

from __future__ import annotations

from pathlib import Path

V2_PACKAGE = "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake"


def write_tree(root: Path, *, version: str = "0.30.0rc3.dev1", v2: bool = True, seed: bool = True,
               glm_next: bool = True) -> Path:
    """Lay out a vllm_ascend package under root; returns root."""
    pkg = root / "vllm_ascend"
    registrations = [("MooncakeConnectorV1", "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector",
                      "MooncakeConnector")]
    if v2:
        registrations.append(("MooncakeConnectorV2", f"{V2_PACKAGE}.connector", "MooncakeConnector"))
    calls = "".join(f"    KVConnectorFactory.register_connector({n!r}, {m!r}, {c!r})\n"
                    for n, m, c in registrations)
    files = {
        "__init__.py": "",
        "_version.py": f"__version__ = version = {version!r}\n__commit_id__ = commit_id = 'g0123abc'\n",
        "distributed/__init__.py": "",
        "distributed/kv_transfer/__init__.py":
            "from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory\n\n\n"
            f"def register_connector():\n{calls}",
        "distributed/kv_transfer/kv_p2p/__init__.py": "",
        "distributed/kv_transfer/kv_p2p/mooncake_connector.py": "class MooncakeConnector:\n    pass\n",
    }
    if v2:
        files["distributed/kv_transfer/kv_p2p/mooncake/__init__.py"] = ""
        files["distributed/kv_transfer/kv_p2p/mooncake/connector.py"] = "class MooncakeConnector:\n    pass\n"
        files["distributed/kv_transfer/kv_p2p/mooncake/pull_worker.py"] = (
            "class PullWorker:\n"
            + ("    def _compute_cross_tp_runs(self, local, remote):\n        return []\n" if seed else
               "    def _compute_group_block_ids(self, local, remote):\n        return []\n"))
    if glm_next:
        files["models/glm5next/__init__.py"] = ""
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
