"""The pairing report as data (JSON for `pdctl plan -o json`, the status' resolved layout) and as a
table an engineer pastes into a design review.

The JSON holds exactly the documented keys (other tools parse it); the table may say more.
"""

from __future__ import annotations

from pd_operator.kv.blocksize import SideLayout
from pd_operator.kv.compat import PairReport
from pd_operator.kv.pages import StateGroupLayout, TailGroupLayout, TokenGroupLayout
from pd_operator.kv.side import Side


def _number(value: float) -> int | float:
    """Whole byte counts print as integers; a compressed indexer can give a fraction per token."""
    return int(value) if float(value).is_integer() else value


def _group_row(g: TokenGroupLayout | StateGroupLayout | TailGroupLayout) -> dict:
    row: dict = {"name": g.name, "kind": g.kind, "replicated": g.replicated}
    if isinstance(g, StateGroupLayout):
        row["bytesPerRequest"] = g.state_bytes
    elif isinstance(g, TailGroupLayout):
        row["bytesPerRequest"] = g.used_bytes
    else:
        row["bytesPerToken"] = _number(g.bytes_per_token)
    row["pageBytes"] = g.page_bytes
    return row


def prefix_caching_summary(side: Side, layout: SideLayout | None) -> dict:
    """Whether the side caches prefixes, and what its blocks cost with it (per rank)."""
    if layout is None:
        return {"enabled": side.prefix_caching}
    return {
        "enabled": side.prefix_caching,
        "hitTokens": layout.prefix_hit_tokens,
        "mambaCacheMode": layout.mamba_cache_mode,
        "stateBlockSize": layout.state_block_size,
        "stateSlotsPerRequest": layout.state_slots_per_request,
        "stateBytesPerRequest": layout.state_bytes_per_request,
        "tokenBytesPerBlock": layout.token_bytes_per_block,
    }


def side_summary(side: Side, layout: SideLayout | None) -> dict:
    return {
        "tensorParallelSize": side.tensor_parallel,
        "dataParallelSize": side.data_parallel,
        "engineBlockSize": layout.engine_block_size if layout else None,
        "cacheGroups": [_group_row(g) for g in layout.groups] if layout else [],
        "prefixCaching": prefix_caching_summary(side, layout),
    }


def report_json(report: PairReport) -> dict:
    plan = report.plan
    transfer = None if plan is None else {
        "segmentTokens": plan.segment_tokens,
        "promptTokens": plan.prompt_tokens,
        "entries": plan.entries,
        "bytes": plan.bytes,
        "perDecodeRank": plan.per_decode_rank(),
        "perPrefillRank": plan.per_prefill_rank(),
    }
    return {
        "compatible": report.compatible,
        "findings": [f.to_dict() for f in report.findings],
        "prefill": side_summary(report.prefill, report.prefill_layout),
        "decode": side_summary(report.decode, report.decode_layout),
        "transfer": transfer,
    }


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _on(value: bool) -> str:
    return "on" if value else "off"


def _cell(value) -> str:
    return "-" if value is None else str(value)


def _sides_table(report: PairReport) -> list[str]:
    p, d = report.prefill, report.decode
    p_layout, d_layout = report.prefill_layout, report.decode_layout
    rows = [
        ("tensor parallel", p.tensor_parallel, d.tensor_parallel),
        ("data parallel", p.data_parallel, d.data_parallel),
        ("pipeline parallel", p.pipeline_parallel, d.pipeline_parallel),
        ("kv cache dtype", p.cache_dtype, d.cache_dtype),
        ("kernel block", p.kernel_block_size, d.kernel_block_size),
        ("engine block (tokens)", p_layout and p_layout.engine_block_size,
         d_layout and d_layout.engine_block_size),
        ("prefix caching", _on(p.prefix_caching), _on(d.prefix_caching)),
    ]
    if p_layout and d_layout:
        rows += [
            ("prefix hits land on (tokens)", p_layout.prefix_hit_tokens, d_layout.prefix_hit_tokens),
            ("state cache mode", p_layout.mamba_cache_mode, d_layout.mamba_cache_mode),
            ("state slots per request", p_layout.state_slots_per_request, d_layout.state_slots_per_request),
            ("state per request", _size(p_layout.state_bytes_per_request),
             _size(d_layout.state_bytes_per_request)),
            ("tokens per block (all layers)", _size(p_layout.token_bytes_per_block),
             _size(d_layout.token_bytes_per_block)),
        ]
    lines = [f"{'':32}{'prefill':>16}{'decode':>16}"]
    lines += [f"{label:32}{_cell(a):>16}{_cell(b):>16}" for label, a, b in rows]
    if p_layout and d_layout:
        p_groups = {g.name: g for g in p_layout.groups}
        for g in d_layout.groups:
            pg = p_groups.get(g.name)
            lines.append(f"{(g.name + ' page (' + g.kind + ')'):32}"
                         f"{_size(pg.page_bytes) if pg else '-':>16}{_size(g.page_bytes):>16}")
    return lines


def report_table(report: PairReport, *, naive_entries: int | None = None) -> str:
    """Plain-text rendering of a pairing report; `naive_entries` is the per-segment plan's run count."""
    lines = [f"model: {report.prefill.model.name}", "", *_sides_table(report), ""]
    lines.append("verdict: " + ("COMPATIBLE" if report.compatible else "INCOMPATIBLE"))
    for f in report.findings:
        where = f" {f.path}" if f.path else ""
        group = f" [{f.group}]" if f.group else ""
        lines.append(f"  {f.severity:7} {f.code}{where}{group}")
        lines.append(f"          {f.message}")
    plan = report.plan
    if plan is not None:
        ranks = plan.per_decode_rank()
        naive = f" (naive per-segment plan: {naive_entries} runs)" if naive_entries is not None else ""
        lines += ["", f"transfer of one {plan.prompt_tokens}-token request into one decode engine "
                      f"({len(ranks)} ranks): {_size(plan.bytes)} in {plan.entries} runs, "
                      f"{plan.segment_tokens}-token segments{naive}"]
        for row in ranks:
            sources = "; ".join(f"{name} <- P{','.join(map(str, grp['prefillRanks']))}"
                                for name, grp in row["groups"].items())
            lines.append(f"  decode rank {row['rank']}: {_size(row['bytes'])}, {row['entries']} runs "
                         f"({sources})")
        lines.append("sent per prefill rank (bytes):")
        for row in plan.per_prefill_rank():
            groups = ", ".join(f"{name} {count:,}" for name, count in row["groups"].items())
            lines.append(f"  prefill rank {row['rank']}: {row['bytes']:,} ({groups})")
    return "\n".join(lines)
