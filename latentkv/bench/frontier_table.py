"""`bench frontier`'s table and plot: KV bytes per token against top-1 agreement, a line per family of rows."""

from __future__ import annotations

from pathlib import Path

from latentkv.plots import new_figure, save_figure


def markdown(rows: list[dict], columns: list[str]) -> str:
    """The table: agreement to 4 places (the targets differ in the third), perplexity to 3."""

    def cell(row, c):
        v = row.get(c)
        if v is None:
            return row.get("failed", "-") if c == "command" else "-"
        return (
            f"{v:.4f}"
            if c.startswith("agreement")
            else f"{v:.3f}"
            if isinstance(v, float)
            else f"{v:,}"
            if isinstance(v, int)
            else str(v)
        )

    lines = [
        "| " + " | ".join(c.replace("_", " ") for c in columns) + " |",
        "| --- |" + " ---: |" * (len(columns) - 2) + " --- |",
    ]
    lines += ["| " + " | ".join(cell(r, c) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def plot_frontier(rows: list[dict], out: Path) -> Path:
    fig, ax = new_figure(
        "KV cache bytes per token vs chat behaviour", "KV bytes per token", "top-1 agreement with the original"
    )
    # one line through one system's KV types; conversions are separate models: points only
    for marker, line, prefix, name in (
        ("s", "-", "llama.cpp", "llama.cpp (original, its KV types)"),
        ("^", "-", "original, q", "original, ggml KV types (float32 forward)"),
        ("v", "-", "original, KIVI", "original, KIVI-style 2-4 bit"),
        ("D", "-", "latentkv kv", "latentkv convert --kv-bytes"),
        ("o", "", "latentkv ", "latentkv folders"),
    ):
        points = sorted(
            (r["bytes_per_token"], r["agreement_float32"])
            for r in rows
            if r["system"].startswith(prefix) and "agreement_float32" in r and r.get("plotted") is None
        )
        for r in rows:
            if r["system"].startswith(prefix):
                r["plotted"] = True
        if points:
            ax.plot(*zip(*points), marker=marker, linestyle=line, label=name)
    for r in rows:
        r.pop("plotted", None)
    return save_figure(fig, out, "frontier")
