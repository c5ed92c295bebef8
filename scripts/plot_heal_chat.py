"""Plot and tabulate heal runs' chat agreement curves (OUT/chat_eval.json of `latentkv heal`) in one figure.

    python scripts/plot_heal_chat.py OUT.png LABEL=RUN_DIR [LABEL=RUN_DIR ...]

Prints one markdown table row per measurement (training minutes, step, top-1 agreement, KL, match mean).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from latentkv.bench.report import new_figure, save_figure
from latentkv.convert.sweep import MIN_AGREEMENT


def main(out: str, runs: list[str]) -> None:
    fig, ax = new_figure(
        "Healing −50% SmolLM2: held-out chat top-1 agreement with the original",
        "training minutes (eval time excluded)",
        "top-1 agreement (32 held-out prompts)",
    )
    print("| run | step | training minutes | top-1 agreement | KL (nats/token) | match mean |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for spec in runs:
        label, folder = spec.split("=", 1)
        curve = json.loads(Path(folder, "chat_eval.json").read_text())["curve"]
        ax.plot([c["train_minutes"] for c in curve], [c["top1_agreement"] for c in curve], marker="o", label=label)
        for c in curve:
            print(
                f"| {label} | {c['step']} | {c['train_minutes']:.1f} | {c['top1_agreement']:.4f} | {c['kl']:.4f} | "
                f"{c['match_mean']:.1f} |"
            )
    ax.axhline(MIN_AGREEMENT, linestyle="--", color="grey", label=f"target {MIN_AGREEMENT}")
    ax.grid(alpha=0.3)
    out = Path(out)
    save_figure(fig, out.parent, out.stem)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
