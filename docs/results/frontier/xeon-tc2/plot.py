"""The transform-coded frontier of these runs as a plot: agreement (24 held-out prompts, float32) and
the worst domain's perplexity ratio against KV bytes per token, per allocation, beside the
KIVI-style quantizations of the original's K/V (../xeon-tc/kivi.json) at the same prompts and windows.

    python docs/results/frontier/xeon-tc2/plot.py   # -> frontier-tc.png beside this file
"""

import json
from pathlib import Path

from latentkv.plots import new_figure, save_figure

HERE = Path(__file__).parent
F16 = 23040  # bytes a token of the original's f16 K/V cache (30 layers x 3 KV heads x 64 x 2 x 2)


def read_rows() -> dict[str, list[tuple[int, float, float]]]:
    """label -> [(bytes per token, agreement, worst domain's perplexity / the original's)], by bytes."""
    series: dict[str, list] = {}

    def add(label, row, ppl):
        worst = max(row[f"ppl_{d}"] / ppl[d] for d in ("docs", "prose", "code"))
        series.setdefault(label, []).append((row["bytes_per_token"], row["agreement_float32"], worst))

    names = {"sides_c": "transform code, per side (centred)", "uniform_c": "transform code, uniform floor (centred)"}
    for line in (HERE / "rows.jsonl").read_text().splitlines():
        row = json.loads(line)
        add(names[row["allocation"]], row, row["original_ppl"])
    kivi = json.loads((HERE.parent / "xeon-tc" / "kivi.json").read_text())
    for row in kivi["rows"]:
        add("original, KIVI-style 2-4 bit", row, kivi["original_ppl"])
    for part in ("rows-a.jsonl", "rows-b.jsonl"):  # the global allocation, not centred (commit a9d46b3)
        for line in (HERE.parent / "xeon-tc" / part).read_text().splitlines():
            row = json.loads(line)
            add("transform code, global (not centred)", row, kivi["original_ppl"])
    return {label: sorted(points) for label, points in series.items()}


def main() -> None:
    series = read_rows()
    fig, ax = new_figure(
        "Bundled SmolLM2: KV bytes vs agreement (24 prompts, float32)",
        "KV bytes per token (share of the original's f16 cache)",
        "agreement with the original",
    )
    for label, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ticks = [F16 * s for s in (0.125, 0.1875, 0.25, 0.375, 0.5)]
    ax.set_xticks(ticks, [f"{t:,.0f}\n{t / F16:.1%}" for t in ticks], fontsize=7)
    ax.axhline(0.95, color="grey", linestyle=":", linewidth=1)
    ax.set_ylim(0, 1.45)  # the legend above the points
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 0.95])
    print(save_figure(fig, HERE, "frontier-tc"))
    for label, points in series.items():
        print(label + ": " + ", ".join(f"{b:,} B {a:.3f} (ppl x{w:.3f})" for b, a, w in points))


if __name__ == "__main__":
    main()
