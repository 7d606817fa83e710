"""The pairing report as data (JSON for `pdctl plan -o json`, the status' resolved layout) and as a
table an engineer pastes into a design review."""

from __future__ import annotations

from pd_operator.kv.blocksize import SideLayout
from pd_operator.kv.compat import PairReport
from pd_operator.kv.pages import StateGroupLayout, TokenGroupLayout
from pd_operator.kv.side import Side


def _group_row(g: TokenGroupLayout | StateGroupLayout) -> dict:
    row: dict = {"name": g.name, "kind": g.kind, "replicated": g.replicated, "layers": g.num_layers,
                 "pageBytes": g.page_bytes}
    if isinstance(g, StateGroupLayout):
        row["bytesPerRequest"] = g.state_bytes
    else:
        row["bytesPerToken"] = g.bytes_per_token
        row["entriesPerBlock"] = g.entries_per_block
    return row


def side_summary(side: Side, layout: SideLayout | None) -> dict:
    out: dict = {"tensorParallelSize": side.tensor_parallel, "dataParallelSize": side.data_parallel,
                 "pipelineParallelSize": side.pipeline_parallel, "kernelBlockSize": side.kernel_block_size,
                 "kvCacheDtype": side.cache_dtype, "engineBlockSize": None, "cacheGroups": []}
    if layout is not None:
        out["engineBlockSize"] = layout.engine_block_size
        out["blockSizeReason"] = layout.reason
        out["cacheGroups"] = [_group_row(g) for g in (*layout.token_groups, *layout.state_groups)]
    return out


def report_json(report: PairReport, *, naive_entries: int | None = None) -> dict:
    out: dict = {
        "model": report.prefill.model.name,
        "compatible": report.compatible,
        "findings": [f.to_dict() for f in report.findings],
        "prefill": side_summary(report.prefill, report.prefill_layout),
        "decode": side_summary(report.decode, report.decode_layout),
        "transfer": None,
    }
    plan = report.plan
    if plan is not None:
        out["transfer"] = {
            "segmentTokens": plan.segment_tokens,
            "promptTokens": plan.prompt_tokens,
            "entries": plan.entries,
            "bytes": plan.bytes,
            "perDecodeRank": plan.per_decode_rank(),
        }
        if naive_entries is not None:
            out["transfer"]["naiveEntries"] = naive_entries
    return out


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def report_table(data: dict) -> str:
    """Plain-text rendering of `report_json`."""
    p, d = data["prefill"], data["decode"]
    lines = [f"model: {data['model']}", ""]
    header = f"{'':22}{'prefill':>18}{'decode':>18}"
    lines.append(header)
    for label, key in (("tensor parallel", "tensorParallelSize"), ("data parallel", "dataParallelSize"),
                       ("pipeline parallel", "pipelineParallelSize"), ("kv cache dtype", "kvCacheDtype"),
                       ("kernel block", "kernelBlockSize"), ("engine block (tokens)", "engineBlockSize")):
        lines.append(f"{label:22}{_cell(p.get(key)):>18}{_cell(d.get(key)):>18}")
    groups = {g["name"]: g for g in p["cacheGroups"]}
    for g in d["cacheGroups"]:
        pg = groups.get(g["name"], {})
        lines.append(f"{(g['name'] + ' page (' + g['kind'] + ')'):22}"
                     f"{_size(pg['pageBytes']) if pg else '-':>18}{_size(g['pageBytes']):>18}")
    lines.append("")
    lines.append("verdict: " + ("COMPATIBLE" if data["compatible"] else "INCOMPATIBLE"))
    for f in data["findings"]:
        where = f" {f['path']}" if f["path"] else ""
        group = f" [{f['group']}]" if f["group"] else ""
        lines.append(f"  {f['severity']:7} {f['code']}{where}{group}")
        lines.append(f"          {f['message']}")
    t = data["transfer"]
    if t:
        lines.append("")
        lines.append(f"transfer of one {t['promptTokens']}-token request into one decode engine "
                     f"({len(t['perDecodeRank'])} ranks): {_size(t['bytes'])} in {t['entries']} runs, "
                     f"{t['segmentTokens']}-token segments"
                     + (f" (naive per-segment plan: {t['naiveEntries']} runs)" if "naiveEntries" in t else ""))
        for row in t["perDecodeRank"]:
            sources = "; ".join(f"{name} <- P{','.join(map(str, grp['prefillRanks']))}"
                                for name, grp in row["groups"].items())
            lines.append(f"  decode rank {row['rank']}: {_size(row['bytes'])}, {row['entries']} runs ({sources})")
    return "\n".join(lines)


def _cell(value) -> str:
    return "-" if value is None else str(value)
