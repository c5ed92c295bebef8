"""Perplexity over several kinds of text (`latentkv eval ppl --domains`): one table, source and
converted side by side, so a conversion cannot look good on the calibration's kind of text alone.

Domains (all offline, the same on every machine):
- docs:  the default corpus's held-out Python documentation (what `eval ppl` scores by default);
- prose: licence texts stored in the repository (latentkv/assets/prose.txt: GPL-3 and
         Apache-2.0) — legal prose, unlike the calibration's documentation and chat;
- code:  Python source of the standard-library modules whose docstrings are in the held-out
         split (so no calibration docstring is scored again as part of its code).
Each is scored with the perplexity protocol (perplexity.py), the first max_tokens // ctx windows.
"""

from __future__ import annotations

import functools
import gc
import sysconfig
from pathlib import Path

from latentkv.eval.perplexity import PROTOCOL, perplexity, text_windows
from latentkv.eval.scorer import model_scorer
from latentkv.sources.corpus import SKIP_DIRS, heldout_text, is_heldout

PROSE_FILE = Path(__file__).parents[1] / "assets" / "prose.txt"
MAX_CODE_CHARS = 400_000  # plenty for the default 8K tokens per domain; keeps reading bounded


@functools.lru_cache(maxsize=1)
def code_documents() -> tuple[tuple[str, str], ...]:
    """(name, source) of held-out standard-library modules, sorted by path, MAX_CODE_CHARS in all."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, size = [], 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        name = f"module:{rel.as_posix()}"  # corpus.py's name for the same module's docstrings
        if SKIP_DIRS & set(rel.parts) or not is_heldout(name):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        docs.append((name, text))
        size += len(text)
        if size >= MAX_CODE_CHARS:
            break
    return tuple(docs)


def code_text() -> str:
    return "\n\n".join(text for _, text in code_documents())


DOMAINS = {
    "docs": heldout_text,
    "prose": lambda: PROSE_FILE.read_text(encoding="utf-8"),
    "code": code_text,
}


def domain_perplexity(
    models: list,
    domains: list[str] | None = None,
    ctx: int = 512,
    max_tokens: int | None = 8192,
    dtype: str = "float32",
) -> dict:
    """Perplexity of each model (path or None: the bundled SmolLM2) on each domain.

    Returns {"domains", "ctx", "max_tokens", "protocol", "models": [{"model", "kind",
    "ppl": {domain: ppl}, "tokens": {domain: n}}]}; the first model is the baseline of the ratios.
    """
    domains = domains or list(DOMAINS)
    unknown = [d for d in domains if d not in DOMAINS]
    if unknown:
        raise ValueError(f"unknown domain(s) {unknown}; known: {list(DOMAINS)}")
    texts = {d: DOMAINS[d]() for d in domains}
    rows = []
    for model in models:
        logits_fn, tokenizer, kind = model_scorer(model, dtype=dtype)
        row = {"model": str(model or "bundled SmolLM2 GGUF"), "kind": kind, "ppl": {}, "tokens": {}}
        for d in domains:
            r = perplexity(logits_fn, text_windows(tokenizer, texts[d], ctx, max_tokens), desc=f"ppl {d}")
            row["ppl"][d], row["tokens"][d] = r["ppl"], r["tokens"]
        rows.append(row)
        del logits_fn
        gc.collect()  # one model in memory at a time
    return {
        "domains": domains,
        "ctx": ctx,
        "max_tokens": max_tokens,
        "protocol": PROTOCOL.format(ctx=ctx),
        "models": rows,
    }


def format_domain_table(result: dict) -> str:
    """Markdown: a row per model, a perplexity column per domain, ratios to the first model."""
    domains, rows = result["domains"], result["models"]
    base = rows[0]["ppl"]
    cols = domains + ([f"{d} ×" for d in domains] if len(rows) > 1 else [])
    lines = ["| model | " + " | ".join(cols) + " |", "| --- |" + " ---: |" * len(cols)]
    for row in rows:
        cells = [f"{row['ppl'][d]:.3f}" for d in domains]
        if len(rows) > 1:
            cells += [f"{row['ppl'][d] / base[d]:.3f}" for d in domains]
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
