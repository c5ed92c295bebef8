"""Plots people compare (PNG): one figure style for the benchmarks and healing. matplotlib is
imported only when a plot is drawn: it is slow to import and picks a backend on import."""

from __future__ import annotations

from pathlib import Path


def new_figure(title: str, xlabel: str, ylabel: str, log_x: bool = False, log_y: bool = False):
    # matplotlib only when a plot is drawn: it is slow to import and picks a backend on import
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log_x:
        ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    return fig, ax


def save_figure(fig, out_dir: Path, name: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.legend(loc="upper left", bbox_to_anchor=(0.12, 0.88), fontsize=8) if fig.axes[0].get_legend_handles_labels()[
        0
    ] else None
    fig.tight_layout()
    fig.savefig(path)
    import matplotlib.pyplot as plt  # see new_figure

    plt.close(fig)
    return path
