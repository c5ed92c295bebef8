"""`convert --kv-bytes N`: the cache with the best measured chat behaviour within N bytes per token.

Candidates: every rope dim on a grid of ROPE_POINTS steps up to all of the source's in each served format of
FORMATS, each with the widest latent whose cache, by the engine's own formula
(cache/accounting.py latent_bytes, scales included), fits N — capped at the width that is
already exact. Each is built in memory from the one calibration (pipeline.build_model) and
scored teacher-forced against the source on the first SELECT_EXAMPLES chat prompts of the
calibration split (the held-out split stays for `eval chat`), through latentkv's own model
with that cache format (eval/chat.py). The best agreement wins; ties go to fewer bytes.

The transform-coded format (TRANSFORM: transform_code.py) is a candidate at every rope dim too: the
latent at its exact width in its PCA basis, every latent and rope-key direction given its bits (0-8)
within N bytes by each allocation of bit_alloc.ALLOCATIONS — the uniform code (the floor: each
layer's K side and V side at one rate), reverse water-filling within each side at the floor's
budget, and over all layers at once on the calibration energies — so rank and rope dims per layer
follow from where the bits go. Each is scored like the others (the uniform code among them, so the
choice never falls below the floor on the selection prompts), through the reference model with its
cache simulated (simulated.py), what the served reference backend computes (cache/coded.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tqdm.auto import tqdm

from latentkv.cache.accounting import latent_bytes, latent_bytes_per_token
from latentkv.config import ModelConfig
from latentkv.convert import bit_alloc
from latentkv.cache import transform_code as tc
from latentkv.convert.layout import converted_model
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model, plan_rope
from latentkv.convert.simulated import coded_chat_model
from latentkv.eval.chat import ChatModel, chat_metrics, render_cases
from latentkv.sources.chat_data import load_chat
from latentkv.sources.reference import source_logits
from latentkv.sources.source_model import SourceModel

# the 8-bit rope first: it leaves the latent the most bytes; q4_0 (4-bit blocks, the rope key turned:
# cache/q4.py) holds the exact conversion at the q4_0 budget of the original's cache
TRANSFORM = tc.KIND  # bits per direction (transform_code.py); measured simulated, served by the reference backend
FORMATS = ("int8_rope8", "int8", "q4_0", TRANSFORM)
TRANSFORM_MIN_LAYER_BYTES = 1 + tc.SCALE_BYTES  # a layer's smallest coded row: one 1-bit direction and its scale
ROPE_POINTS = 6  # SmolLM2 (3 KV heads x 64): rope 32, 64, ... 192
SELECT_EXAMPLES = 48
MIN_RANK = 8


@dataclass
class Candidate:
    rope_dim: int
    kv_rank: int
    cache_dtype: str
    bytes_per_token: int
    agreement: float | None = None
    code: dict | None = None  # TRANSFORM: the allocation (TransformCode.to_dict), once made
    allocation: str | None = None  # TRANSFORM: which of bit_alloc.ALLOCATIONS gives the bits

    def label(self) -> str:
        fmt = self.cache_dtype + (f" ({self.allocation})" if self.allocation else "")
        return f"rope {self.rope_dim} + rank {self.kv_rank}, {fmt}: {self.bytes_per_token} B/token"


def candidates(src: SourceModel, kv_bytes: int, formats=FORMATS, rope_dims=None) -> list[Candidate]:
    """Every (format, rope dim) with room for a latent of at least MIN_RANK, at its widest rank
    (rope_dims: ints or "all"; None: ROPE_POINTS steps up to all of the source's)."""
    layers, full_rope = src.num_layers, src.num_kv_heads * src.head_dim
    step = max(2, full_rope // ROPE_POINTS // 2 * 2)
    if rope_dims:
        rope_dims = sorted({full_rope if d == "all" else int(d) for d in rope_dims})
    else:
        rope_dims = sorted({*range(step, full_rope, step), full_rope})
    out = []
    for fmt in formats:
        for dr in rope_dims:
            exact_rank = (full_rope - dr) + full_rope  # rows of Z = [f_K; V]: the dropped key dims and V
            if fmt == TRANSFORM:  # every direction kept; the bits decide (bytes: once allocated)
                if kv_bytes >= layers * TRANSFORM_MIN_LAYER_BYTES:
                    out += [Candidate(dr, exact_rank, fmt, kv_bytes, allocation=a) for a in bit_alloc.ALLOCATIONS]
                continue
            rank = widest_rank(layers, dr, fmt, kv_bytes, exact_rank)
            if rank >= MIN_RANK:
                out.append(Candidate(dr, rank, fmt, latent_bytes([rank] * layers, dr, fmt)))
    return out


def widest_rank(layers: int, rope_dim: int, fmt: str, kv_bytes: int, cap: int) -> int:
    """The widest latent (at most cap) whose cache fits kv_bytes per token, by the engine's formula
    (bytes grow with the rank, in steps where scales come in groups); 0 if none does."""
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if latent_bytes([mid] * layers, rope_dim, fmt) <= kv_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def choose(
    src: SourceModel, stats, options: ConvertOptions, windows=None, log=tqdm.write, formats=FORMATS
) -> tuple[ConvertOptions, list]:
    """-> (options with rope_dim, kv_rank and cache_dtype (or cache_format) chosen, every candidate measured)."""
    check(src, options.kv_bytes)
    found = candidates(src, options.kv_bytes, options.kv_formats or formats, options.kv_rope_dims)
    if not found:
        raise ValueError(f"--kv-bytes {options.kv_bytes}: no candidate among the formats and rope dims asked")
    tokenizer = src.tokenizer()
    reference = ChatModel(lambda ids: source_logits(src, ids), tokenizer, "source", str(src.path), memoize=True)
    cases = render_cases(tokenizer, load_chat(src.path, "calib")[:SELECT_EXAMPLES])
    plans, coded = {}, {}
    for cand in tqdm(found, desc=f"measuring caches within {options.kv_bytes} B/token", unit="cache"):
        settings = candidate_options(options, cand)
        plans_info = plans.setdefault(cand.rope_dim, plan_rope(src, stats, settings))
        if cand.cache_dtype == TRANSFORM:  # one conversion per rope dim; the allocations differ in bits only
            if cand.rope_dim not in coded:
                cfg, tensors, _ = build_model(src, stats, settings, plans_info, windows=windows)
                energies = bit_alloc.model_energies(cfg, tensors, stats, options.k_weight, centred=True)
                means = [bit_alloc.layer_means(cfg, tensors, i, st) for i, st in enumerate(stats)]
                coded = {cand.rope_dim: (cfg, tensors, energies, means)}
            cfg, tensors, energies, means = coded[cand.rope_dim]
            code = bit_alloc.allocation(cand.allocation, energies, options.kv_bytes)
            code = code.centred([m[0] for m in means], [m[1] for m in means])
            model = converted_model(cfg, tensors)
            cand.code, cand.bytes_per_token = code.to_dict(), code.bytes_per_token()
            log(f"latentkv convert: rope {cand.rope_dim}, {cand.allocation}: {code.describe()}")
            mine = coded_chat_model(model, code, tokenizer, "")
        else:
            cfg, tensors, _ = build_model(src, stats, settings, plans_info, windows=windows)
            mine = ChatModel.from_mla(converted_model(cfg, tensors), tokenizer, "", cand.cache_dtype)
        if len(found) == 1:  # nothing to choose between
            cand.agreement = float("nan")
            break
        cand.agreement = chat_metrics(mine, reference, cases, generate=False)["top1_agreement"]
        log(
            f"latentkv convert: {cand.label()}: top-1 agreement {cand.agreement:.4f} "
            f"on {len(cases)} calibration prompts"
        )
    best = max(found, key=lambda c: (c.agreement, -c.bytes_per_token))
    log(f"latentkv convert: chose {best.label()}")
    chosen = candidate_options(options, best)
    return replace(chosen, kv_bytes=options.kv_bytes, cache_format=best.code), found


def candidate_options(options: ConvertOptions, cand: Candidate) -> ConvertOptions:
    """The conversion a candidate is: its sizes, and its cache as the folder's default (the transform
    code's latent in its PCA basis, recorded as cache_format instead of a cache dtype)."""
    coded = cand.cache_dtype == TRANSFORM
    return replace(
        options,
        rope_dim=cand.rope_dim,
        kv_rank=cand.kv_rank,
        cache_ratio=None,
        kv_bytes=None,
        cache_dtype=None if coded else cand.cache_dtype,
        rotate_latent=not coded,
    )


def check(src: SourceModel, kv_bytes: int) -> None:
    """Refuse a budget with no candidate before the (long) calibration."""
    if not candidates(src, kv_bytes):
        layers = src.num_layers
        smallest = min(
            layers * TRANSFORM_MIN_LAYER_BYTES if fmt == TRANSFORM else latent_bytes([MIN_RANK] * layers, 2, fmt)
            for fmt in FORMATS
        )
        raise ValueError(
            f"--kv-bytes {kv_bytes} is below the smallest cache this converter makes "
            f"({smallest} bytes per token for {src.num_layers} layers)"
        )


def check_written(cfg: dict, options: ConvertOptions) -> None:
    """The folder's config, as the engine will read it, serves within the budget (the same formula
    the engine allocates with: cache/accounting.py)."""
    if options.kv_bytes is None:
        return
    if options.cache_format is not None:
        served = tc.TransformCode.from_dict(options.cache_format, cfg["num_hidden_layers"]).bytes_per_token()
    else:
        served = latent_bytes_per_token(ModelConfig.from_dict(cfg), options.cache_dtype)
    if served > options.kv_bytes:
        raise AssertionError(f"the converted cache takes {served} bytes per token, over --kv-bytes {options.kv_bytes}")
