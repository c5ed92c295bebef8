"""`latentkv bench frontier`: KV cache bytes per token against behaviour, one table and one plot.

Rows (each names the command that makes it):
- llama.cpp on the original GGUF with an f16, q8_0 and q4_0 KV cache (`-ctk X -ctv X`; in its own
  process: a crash or a missing llama-cpp-python is recorded, never the end of the bench);
- the original in latentkv's float32 reference forward with its K (after RoPE) and V taken through
  each llama.cpp KV type and back (ggml_round_trip): the same cache formats without llama.cpp's own
  numerics (its activations quantized for the dot products), as the conversions are measured;
- the original with KIVI-style 2-4-bit K (per channel) and V (per token) caches (bench/kivi.py);
- latentkv's conversions: `convert --kv-bytes N` at each budget (by default 50%, 37.5%, 25%,
  18.75% and 12.5% of the original's f16 bytes; one calibration shared by all) and any folders
  given, each in the cache format it is served in — a transform-coded folder in its format
  simulated in the reference model (convert/simulated.py: what the served reference backend computes).
Measures: teacher-forced top-1 agreement with the original's float32 reference forward on the
held-out chat prompts (eval/chat.py's metric: the original's greedy answers, the original judged in
the same run), in float32 and (ours) bfloat16, and perplexity on the three domains of
`eval ppl --domains` (docs, prose, code) with the same windows for every row.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from latentkv.bench import isolated, kivi
from latentkv.bench.frontier_table import markdown, plot_frontier
from latentkv.bench.report import write_json
from latentkv.bench.systems import llama_cpp_available
from latentkv.cache.accounting import gqa_bytes_per_token, latent_bytes_per_token
from latentkv.config import ModelConfig
from latentkv.convert.api import calibration_windows, convert
from latentkv.convert.calibrate import collect_stats
from latentkv.convert.options import ConvertOptions, calib_torch_dtype
from latentkv.cache.transform_code import folder_code
from latentkv.convert.simulated import coded_chat_model
from latentkv.eval.chat import ChatModel, render_cases
from latentkv.eval.domains import DOMAINS
from latentkv.eval.perplexity import perplexity, text_windows
from latentkv.facts import CACHE_DTYPES
from latentkv.model.loader import load_model
from latentkv.sources.chat_data import load_chat
from latentkv.sources.readers import read_source
from latentkv.sources.reference import source_logits

# llama.cpp's KV types: ggml type id and bytes per element (q8_0: 32 values in 34 bytes, q4_0: in 18)
LLAMA_KV = {"f16": (1, 2.0), "q8_0": (8, 34 / 32), "q4_0": (2, 18 / 32)}
FULL = {"examples": None, "ppl_tokens": 8192, "calib_tokens": ConvertOptions().calib_tokens, "ctx": 512}
QUICK = {"examples": 3, "ppl_tokens": 128, "calib_tokens": 256, "ctx": 64}
LLAMA_SCORER = "latentkv.bench.frontier:LlamaCppScorer"  # built in its own process (isolated.py)
GGML_BLOCK = 32  # values per q8_0 / q4_0 block, each with one float16 scale
SYSTEMS = ("llama.cpp", "reference", "kivi", "latentkv")
BUDGET_FRACTIONS = (0.5, 0.375, 0.25, 0.1875, 0.125)  # of the original's f16 KV bytes per token


def ggml_round_trip(x: torch.Tensor, kind: str) -> torch.Tensor:
    """x [..., d] (d a multiple of 32) stored as llama.cpp's `kind` and read back: ggml's reference
    quantizers (q8_0: d = amax/127, round(x/d); q4_0: d = -(the value of largest magnitude)/8,
    min(15, trunc(x/d + 8.5)) - 8), each block's scale stored as float16."""
    if kind == "f16":
        return x.half().to(x.dtype)
    b = x.reshape(*x.shape[:-1], -1, GGML_BLOCK)
    if kind == "q8_0":
        d = b.abs().amax(-1, keepdim=True) / 127
        q = torch.round(b * torch.where(d > 0, 1 / d, 0))
    else:
        d = b.gather(-1, b.abs().argmax(-1, keepdim=True)) / -8
        q = (b * torch.where(d != 0, 1 / d, 0) + 8.5).trunc().clamp(max=15) - 8
    return (q * d.half().to(x.dtype)).reshape(x.shape)


def default_budgets(src) -> list[int]:
    """BUDGET_FRACTIONS of the original's f16 KV bytes per token."""
    f16 = gqa_bytes_per_token(src.num_layers, src.num_kv_heads, src.head_dim, "float16")
    return [round(f16 * f) for f in BUDGET_FRACTIONS]


def llama_bytes(src, kind: str) -> int:
    return round(2 * src.num_layers * src.num_kv_heads * src.head_dim * LLAMA_KV[kind][1])


class LlamaCppScorer:
    """The original GGUF in llama.cpp with one KV cache type; argmax rows and window NLLs (in the
    bench's child process: isolated.IsolatedSystem forwards the calls)."""

    def __init__(self, name: str, gguf: str, kind: str, n_ctx: int):
        from llama_cpp import Llama  # optional (the `bench` extra); only when this baseline runs

        ggml_type = LLAMA_KV[kind][0]
        self.llm = Llama(
            model_path=gguf,
            n_ctx=n_ctx,
            n_batch=n_ctx,
            n_ubatch=n_ctx,
            logits_all=True,
            type_k=ggml_type,
            type_v=ggml_type,
            flash_attn=True,
            n_threads=torch.get_num_threads(),
            verbose=False,
        )

    def rows(self, ids: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(ids)
        return np.asarray(self.llm.scores[: len(ids)], dtype=np.float32)

    def top1(self, cases: list[tuple[list[int], int]]) -> list[list[int]]:
        """Per (ids, answer_start): argmax of the rows that predict the answer."""
        return [self.rows(ids)[start - 1 : len(ids) - 1].argmax(-1).tolist() for ids, start in cases]

    def nll(self, windows: list[list[int]]) -> tuple[float, int]:
        """Summed next-token NLL over every window's positions 1.., and their count."""
        total, count = 0.0, 0
        for ids in windows:
            logits = torch.from_numpy(self.rows(ids))[:-1]
            total += float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum"))
            count += len(ids) - 1
        return total, count


class Judge:
    """The held-out chat cases, the original's answer argmaxes and perplexity windows, once."""

    def __init__(self, src, examples: int | None, ppl_tokens: int, ctx: int):
        self.src, tokenizer = src, src.tokenizer()
        reference = ChatModel(lambda ids: source_logits(src, ids), tokenizer, "source", str(src.path))
        self.cases = render_cases(tokenizer, load_chat(src.path, "heldout")[:examples])
        self.ref_top = [reference.answer_logprobs(c).argmax(-1) for c in tqdm(self.cases, desc="original's answers")]
        self.windows = {d: text_windows(tokenizer, text(), ctx, ppl_tokens) for d, text in DOMAINS.items()}
        self.base = {
            d: perplexity(reference.logits, w, desc=f"original ppl {d}")["ppl"] for d, w in self.windows.items()
        }

    def agreement(self, tops: list) -> float:
        agree = sum(int((torch.as_tensor(t) == r).sum()) for t, r in zip(tops, self.ref_top))
        return agree / sum(len(r) for r in self.ref_top)

    def measure(self, mine: ChatModel, dtype: str = "float32") -> dict:
        """Agreement in `dtype`; with float32, perplexity on every domain too."""
        row = {f"agreement_{dtype}": self.agreement([mine.answer_logprobs(c).argmax(-1) for c in self.cases])}
        if dtype == "float32":
            for d, w in self.windows.items():
                row[f"ppl_{d}"] = perplexity(mine.logits, w, desc=f"ppl {d}")["ppl"]
        return row

    def mla(self, folder: Path, cache_dtype: str, dtype: str, code=None) -> dict:
        """A folder in `cache_dtype`, or with `code` (a TransformCode) its cache simulated."""
        model = load_model(folder, dtype=getattr(torch, dtype))
        if code is not None:
            return self.measure(coded_chat_model(model, code, None, str(folder)), dtype)
        return self.measure(
            ChatModel(lambda ids: model.full_logits(ids, cache_dtype=cache_dtype), None, "mla", str(folder)), dtype
        )

    def original(self, kv) -> dict:
        """The original (float32 reference forward) with its K and V through `kv` (reference.KVStore)."""

        def logits(ids):
            return source_logits(self.src, ids, kv)

        return self.measure(ChatModel(logits, None, "source", str(self.src.path)))

    def llama(self, system) -> dict:
        row = {
            "agreement_float32": self.agreement(
                system.call("top1", [(list(c.ids), c.answer_start) for c in self.cases])
            )
        }
        for d, w in self.windows.items():
            total, count = system.call("nll", w.tolist())
            row[f"ppl_{d}"] = math.exp(total / count)
        return row


def budget_options(kv_bytes: int, preset: dict, formats=None, rope_dims=None) -> ConvertOptions:
    return ConvertOptions(
        kv_bytes=kv_bytes,
        calib_tokens=preset["calib_tokens"],
        ctx=preset["ctx"],
        eval_tokens=0,
        kv_formats=formats,
        kv_rope_dims=rope_dims,
    )


def budget_folders(src, budgets: list[int], out: Path, preset: dict, log, formats=None, rope_dims=None) -> list:
    """`convert --kv-bytes N` into out/kvN for each budget, calibrated once (a folder already there
    for its budget is reused)."""
    folders, stats = [], None
    for kv_bytes in budgets:
        folder = out / f"kv{kv_bytes}"
        if (folder / "config.json").is_file() and ModelConfig.from_file(folder / "config.json").extensions.get(
            "kv_bytes"
        ) == kv_bytes:
            log(f"bench frontier: reusing {folder} (converted within {kv_bytes} B/token)")
            folders.append(folder)
            continue
        options = budget_options(kv_bytes, preset, formats, rope_dims)
        if stats is None:
            windows, weights = calibration_windows(
                src, None, options.calib_tokens, options.ctx, options.calib_chat, options.calib_weight
            )
            stats = collect_stats(src, windows, dtype=calib_torch_dtype(options.calib_dtype), weights=weights)
        folders.append(convert(src, folder, options, stats=stats))
    return folders


def folder_arg(text: str) -> tuple[Path, str | None, str]:
    """ "DIR" or "DIR:CACHE_DTYPE" -> (folder, cache dtype or None: its own, the command that measures it)."""
    folder, _, cache_dtype = text.rpartition(":")
    if cache_dtype not in CACHE_DTYPES:
        folder, cache_dtype = text, None
    return (
        Path(folder),
        cache_dtype,
        f"latentkv eval chat {folder}" + (f" --cache-dtype {cache_dtype}" if cache_dtype else ""),
    )


def our_rows(judge: Judge, folders: list[tuple[Path, str, str]], dtypes: list[str]) -> list[dict]:
    """(folder, cache dtype or None: the folder's own, command) -> a row each."""
    rows = []
    for folder, cache_dtype, command in folders:
        cfg = ModelConfig.from_file(folder / "config.json")
        code = folder_code(cfg) if cache_dtype is None else None
        if code is not None:
            row = {
                "system": f"latentkv {folder.name} (simulated {code.describe()})",
                "bytes_per_token": code.bytes_per_token(),
                "command": command,
            }
        else:
            cache_dtype = cfg.served_cache_dtype(cache_dtype or "auto")
            row = {
                "system": f"latentkv {folder.name} (rope {cfg.qk_rope_head_dim} + rank {cfg.kv_lora_rank}, "
                f"{cache_dtype})",
                "bytes_per_token": latent_bytes_per_token(cfg, cache_dtype, "bfloat16"),
                "command": command,
            }
        for dtype in dtypes:
            row.update(judge.mla(folder, cache_dtype, dtype, code))
        rows.append(row)
    return rows


def llama_rows(judge: Judge, gguf: str | None, failed: dict, ctx: int) -> list[dict]:
    if not (gguf and gguf.endswith(".gguf")):
        return []
    if not llama_cpp_available():
        failed["llama.cpp"] = "skipped: llama-cpp-python is not installed (`pip install latentkv[bench]`)"
        return []
    n_ctx = max(ctx, max(len(c.ids) for c in judge.cases)) + 1
    rows = []
    for kind in LLAMA_KV:
        name = f"llama.cpp original, {kind} KV"
        for system in isolated.start(failed, name, LLAMA_SCORER, gguf, kind, n_ctx):
            try:
                measured = judge.llama(system)
            except isolated.BaselineFailed as e:
                failed[name] = e.reason
                continue
            finally:
                system.close()
            rows.append(
                {
                    "system": name,
                    "bytes_per_token": llama_bytes(judge.src, kind),
                    "command": f"llama.cpp -ctk {kind} -ctv {kind} (llama-cpp-python type_k/type_v, flash_attn)",
                    **measured,
                }
            )
    return rows


def reference_rows(judge: Judge) -> list[dict]:
    """The original's cache in each llama.cpp KV type, everything else float32 (ggml_round_trip)."""
    if judge.src.head_dim % GGML_BLOCK:
        return []
    return [
        {
            "system": f"original, {kind} KV (float32 forward, cache round trip)",
            "bytes_per_token": llama_bytes(judge.src, kind),
            "command": f"latentkv bench frontier --systems reference ({kind})",
            **judge.original(lambda x, kind=kind: ggml_round_trip(x, kind)),
        }
        for kind in LLAMA_KV
    ]


def kivi_rows(judge: Judge) -> list[dict]:
    """The original's K and V through each of kivi.VARIANTS, everything else float32."""
    src = judge.src
    return [
        {
            "system": f"original, {kivi.label(*v)} (float32 forward, cache round trip)",
            "bytes_per_token": kivi.bytes_per_token(src.num_layers, src.num_kv_heads, src.head_dim, *v),
            "command": f"latentkv bench frontier --systems kivi ({v[0]} bits)",
            **judge.original(kivi.round_trips(*v)),
        }
        for v in kivi.VARIANTS
    ]


def run_frontier(
    source=None,
    out: Path = Path("bench-results/frontier"),
    budgets: list[int] | None = None,
    folders: list[str] = (),
    quick: bool = False,
    dtypes=("float32", "bfloat16"),
    log=print,
    systems=SYSTEMS,
    formats=None,
    rope_dims=None,
) -> dict:
    preset = QUICK if quick else FULL
    out = Path(out)
    src = read_source(source)
    budgets = budgets or default_budgets(src)
    judge = Judge(src, preset["examples"], preset["ppl_tokens"], preset["ctx"])
    failed: dict = {}
    rows = llama_rows(judge, str(src.path), failed, preset["ctx"]) if "llama.cpp" in systems else []
    rows += reference_rows(judge) if "reference" in systems else []
    rows += kivi_rows(judge) if "kivi" in systems else []
    if "latentkv" in systems:
        given = [folder_arg(f) for f in folders]
        command = "".join(
            [
                f" --kv-formats {' '.join(formats)}" if formats else "",
                f" --kv-rope-dims {' '.join(map(str, rope_dims))}" if rope_dims else "",
            ]
        )
        made = [
            (folder, None, f"latentkv convert --kv-bytes {b}{command} --out kv{b}")
            for b, folder in zip(budgets, budget_folders(src, budgets, out, preset, log, formats, rope_dims))
        ]
        rows += our_rows(judge, given + made, list(dtypes))
    for name, reason in failed.items():
        rows.append({"system": name, "failed": reason})
    rows.sort(key=lambda r: -r.get("bytes_per_token", 0))
    columns = [
        "system",
        "bytes_per_token",
        *[f"agreement_{d}" for d in dtypes],
        *[f"ppl_{d}" for d in DOMAINS],
        "command",
    ]
    table = markdown(rows, columns)
    log(
        f"Frontier: KV bytes/token vs held-out chat top-1 agreement ({len(judge.cases)} prompts) and perplexity "
        f"(original: {', '.join(f'{d} {p:.3f}' for d, p in judge.base.items())})\n{table}"
    )
    payload = {
        "source": str(src.path),
        "budgets": budgets,
        "examples": len(judge.cases),
        "original_ppl": judge.base,
        "rows": rows,
        "failed": failed,
    }
    write_json(out, "frontier", payload)
    (out / "frontier.md").write_text(table + "\n")
    plot_frontier(rows, out)
    return payload


def run(args) -> dict:
    rope_dims = [d if d == "all" else int(d) for d in args.kv_rope_dims] if args.kv_rope_dims else None
    return run_frontier(
        args.source,
        Path(args.out),
        args.budgets,
        args.folders or (),
        args.quick,
        systems=args.systems,
        formats=args.kv_formats,
        rope_dims=rope_dims,
    )
