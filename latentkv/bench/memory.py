"""`latentkv bench memory`: KV bytes per token and cache size by context, MLA vs GQA vs MHA,
plus measured resident memory of our engine and of transformers holding N tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ..cache.accounting import gqa_bytes_per_token, latent_bytes_per_token
from ..config import ModelConfig
from ..plots import new_figure, save_figure
from .report import print_table, write_json
from .shapes import DEEPSEEK_V2_LITE, DEEPSEEK_V3

CONTEXTS = [1024 * 2**i for i in range(7)]  # 1K .. 64K
MIB = 2**20


def cache_rows(name: str, cfg: ModelConfig, gqa: tuple[int, int, int] | None) -> list[dict]:
    """One row per cache layout of a model: bytes per token and at each context.
    gqa = (layers, kv_heads, head_dim) of the original model when it was GQA."""
    layers = cfg.num_hidden_layers
    layouts = {
        "MHA bf16 (same heads)": gqa_bytes_per_token(layers, cfg.num_attention_heads, gqa[2] if gqa else cfg.v_head_dim)
    }
    if gqa:
        layouts["GQA bf16 (original)"] = gqa_bytes_per_token(*gqa)
    for dtype, label in (("auto", "MLA bf16"), ("int8", "MLA int8"), ("fp8_e4m3", "MLA fp8")):
        layouts[label] = latent_bytes_per_token(cfg, dtype, "bfloat16")
    rows = []
    for label, per_token in layouts.items():
        row = {"model": name, "cache": label, "bytes/token": per_token}
        row.update({f"{c // 1024}K MiB": per_token * c / MIB for c in CONTEXTS})
        rows.append(row)
    return rows


def source_shape(folder: Path, model_cfg: ModelConfig) -> tuple[int, int, int] | None:
    """The original GQA shape (layers, kv heads, head dim), from the conversion cache's
    provenance file or the converter's record, if either has it."""
    provenance = folder / "latentkv-source.json"
    if provenance.exists():
        geo = json.loads(provenance.read_text()).get("geometry") or {}
        if geo:
            return geo["num_layers"], geo["num_kv_heads"], geo["head_dim"]
    src = model_cfg.extensions.get("source") or {}
    kv_heads, head_dim = src.get("num_key_value_heads"), src.get("head_dim")
    if kv_heads and head_dim:
        return model_cfg.num_hidden_layers, kv_heads, head_dim
    return None


def probe_rss(engine: str, model: str, tokens: int, dtype: str = "bfloat16") -> dict:
    """Run one measurement in a fresh process so the numbers do not mix."""
    cmd = [sys.executable, "-m", "latentkv.bench.memory_probe", engine, model, str(tokens), dtype]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args) -> dict:
    out = Path(args.out)
    rows = []
    if args.model:
        cfg = ModelConfig.from_file(Path(args.model) / "config.json")
        rows += cache_rows(Path(args.model).name, cfg, source_shape(Path(args.model), cfg))
    rows += cache_rows("DeepSeek-V2-Lite", ModelConfig.from_dict(DEEPSEEK_V2_LITE), None)
    rows += cache_rows("DeepSeek-V3", ModelConfig.from_dict(DEEPSEEK_V3), None)
    columns = ["model", "cache", "bytes/token"] + [f"{c // 1024}K MiB" for c in CONTEXTS]
    print_table("KV cache per token and at each context (analytic, bf16 model dtype)", columns, rows)

    measured = []
    if args.model and not args.no_measure:
        for tokens in [1024] if args.quick else [1024, 4096]:
            ours = probe_rss("latentkv", args.model, tokens)
            ref = probe_rss("transformers", args.source, tokens) if args.source else {"error": "no --source"}
            measured.append({"tokens": tokens, "latentkv": ours, "transformers": ref})
        mrows = [
            {"tokens": m["tokens"], "engine": name, **{k: v for k, v in m[name].items()}}
            for m in measured
            for name in ("latentkv", "transformers")
        ]
        print_table(
            "Resident memory holding N tokens (MiB; fresh process each)",
            ["tokens", "engine", "rss_model_mib", "rss_held_mib", "held_delta_mib", "error"],
            mrows,
        )

    plot_memory(rows, out)
    payload = {"analytic": rows, "measured": measured, "contexts": CONTEXTS}
    write_json(out, "memory", payload)
    return payload


def plot_memory(rows: list[dict], out: Path) -> Path:
    fig, ax = new_figure("KV cache size vs context", "context (tokens)", "cache (MiB)", log_x=True, log_y=True)
    for row in rows:
        ax.plot(
            CONTEXTS,
            [row[f"{c // 1024}K MiB"] for c in CONTEXTS],
            marker="o",
            ms=3,
            label=f"{row['model']}: {row['cache']}",
        )
    return save_figure(fig, out, "memory")
