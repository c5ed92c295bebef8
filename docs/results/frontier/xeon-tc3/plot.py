"""The transform-coded frontier (../xeon-tc2: the conversions, 24 held-out prompts, float32) with the healed
folders of this run (judge.jsonl) as points beside the conversions they heal.

    python docs/results/frontier/xeon-tc3/plot.py   # -> frontier-heal.png beside this file
"""

import json
import sys
from pathlib import Path

from latentkv.plots import new_figure, save_figure

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "xeon-tc2"))
from plot import F16, read_rows  # noqa: E402  (the earlier run's series)


def main() -> None:
    series = read_rows()
    rows = [json.loads(line) for line in (HERE / "judge.jsonl").read_text().splitlines()]
    ppl = rows[0]["original_ppl"]
    for name, label in (("", "conversion (this run's folders)"), ("-healed", "healed 30 min through its codes")):
        points = []
        for row in rows[1:]:
            if row["folder"].endswith("-healed") == bool(name):
                worst = max(row[f"ppl_{d}"] / ppl[d] for d in ("docs", "prose", "code"))
                points.append((row["bytes_per_token"], row["agreement_float32"], worst))
        series[label] = sorted(points)
    fig, ax = new_figure(
        "SmolLM2: the coded cache healed in the loop (24 prompts, fp32)",
        "KV bytes per token (share of the original's f16 cache)",
        "agreement with the original",
    )
    for label, points in series.items():
        style = {"linestyle": "none", "markersize": 9} if "this run" in label or "healed" in label else {}
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label, **style)
    ticks = [F16 * s for s in (0.125, 0.1875, 0.25, 0.375, 0.5)]
    ax.set_xticks(ticks, [f"{t:,.0f}\n{t / F16:.1%}" for t in ticks], fontsize=7)
    ax.axhline(0.95, color="grey", linestyle=":", linewidth=1)
    ax.axhline(0.90, color="grey", linestyle=":", linewidth=1)
    ax.set_ylim(0, 1.45)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95])
    print(save_figure(fig, HERE, "frontier-heal"))
    for label, points in series.items():
        print(label + ": " + ", ".join(f"{b:,} B {a:.3f} (ppl x{w:.3f})" for b, a, w in points))


if __name__ == "__main__":
    main()
