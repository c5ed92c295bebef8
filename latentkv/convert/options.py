"""`ConvertOptions`: everything a conversion can be told, with the measured defaults."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from latentkv import cpu
from latentkv.convert.refine import INPUTS
from latentkv.facts import CACHE_DTYPES, MODEL_DTYPES


@dataclass(frozen=True)
class ConvertOptions:
    """Sizes — rope_dim: even int or "all"; kv_rank: int (mean latent width), "full" or a
    per-layer list; cache_ratio: cache elements as a fraction of the source's (sets both);
    none of the three: the exact conversion, served in api.DEFAULT_CACHE_DTYPE (--stock: api.DEFAULT_STOCK_RATIO,
    snapped to the target's widths); kv_bytes: instead of them, a
    budget of served cache bytes per token (all layers, scales included): the rope dim, rank and
    cache format with the best measured chat agreement within it (budget.py); cache_dtype: the
    cache format the folder records as its default (latentkv.cache_dtype; kv_bytes and the default size set it).
    Data — calib: text files (None: the default corpus); calib_tokens; ctx (window length
    for calibration and evaluation); eval_tokens (held-out tokens to measure, 0: skip);
    calib_dtype: the calibration forward's matmuls, or "auto" (calib_torch_dtype; the
    statistics are always float32 or wider); calib_chat: the share of calibration tokens taken
    from chat conversations in the source's chat template (corpus.chat_windows), the rest from
    the documents (0: documents only); calib_weight: how many times each position of the chat
    answers and the template's control tokens counts in the calibration statistics (1: every
    position once; corpus.marked_chat_windows).
    Output — stock: plain deepseek_v3 (loads in unmodified transformers / vLLM);
    dtype; rope_theta: the stock schedule (None: chosen); target: the engine whose stock widths
    (kv rank + rope) to snap to ("vllm", "vllm-cpu", "flashmla", "any"; stock.py); stock_width:
    force one (above what the source needs is zero-padded).
    Method — k_weight: extra weight of key against value error in the latent's
    attention-output metric (the first-order model underrates score errors; 5 was best by docs
    perplexity when φ was measured over every distance, 2 is best for chat behaviour with the
    phase window: docs/conversion.md, "The phase window");
    rope_window: the query–key distances (tokens) over which a dropped RoPE pair's mean phase φ
    (folded into the query) is measured (None: every distance of the calibration window; the
    kept pairs are ranked over every distance; native format only: rope_plan.plan_layer);
    refine_steps: Adam steps per layer fitting the converted attention output to the source's on
    the calibration windows after the closed form (0: off; refine.py), refine_lr its step relative
    to each tensor's scale, refine_inputs each layer's inputs: "converted" (the refined layers
    below, as GPTQ) or "source"."""

    rope_dim: int | str | None = None
    kv_rank: int | str | list | None = None
    cache_ratio: float | None = None
    kv_bytes: int | None = None
    cache_dtype: str | None = None
    calib: list | None = None
    calib_tokens: int = 16384  # 32768 measured no better (docs/conversion.md, "Time and memory")
    calib_chat: float = 0.5  # measured: docs/conversion.md, "Calibration that covers use"
    calib_weight: float = 1.0  # measured: docs/conversion.md, "Calibration share"
    ctx: int = 512
    eval_tokens: int = 4096
    calib_dtype: str = "auto"  # bfloat16 where the hardware has native bf16 matmuls, else float32
    stock: bool = False
    dtype: str = "float32"
    rope_theta: float | None = None
    target: str = "vllm"
    stock_width: int | None = None
    k_weight: float = 2.0
    rope_window: int | None = 64  # measured: docs/conversion.md, "The phase window"
    refine_steps: int = 0
    refine_lr: float = 3e-3  # of 1e-3, 3e-3, 1e-2: the lowest held-out error (docs/conversion.md, "Local refinement")
    refine_inputs: str = "converted"
    rotate_latent: bool = True  # False: the latent in its PCA basis (a transform-coded cache: transform_code.py)
    kv_formats: tuple | None = None  # the cache formats --kv-bytes tries (None: all of budget.FORMATS)
    kv_rope_dims: tuple | None = None  # the rope dims it tries (ints or "all"; None: budget.ROPE_POINTS of them)
    cache_format: dict | None = None  # a transform-coded cache's record (transform_code.py), set by --kv-bytes

    def check(self) -> None:
        """Errors that need no source."""
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(MODEL_DTYPES)}")
        if self.calib_dtype not in ("auto", *MODEL_DTYPES):
            raise ValueError(f"calib_dtype must be auto or one of {', '.join(MODEL_DTYPES)}")
        if self.stock and self.dtype == "float16":
            raise ValueError(
                "export --stock as float32 or bfloat16: its latent (~1e-4) is below float16's normal range"
            )
        if self.kv_bytes is not None and (self.rope_dim, self.kv_rank, self.cache_ratio) != (None, None, None):
            raise ValueError("give --kv-bytes or sizes (--rope-dim, --kv-rank, --cache-ratio), not both")
        if self.kv_bytes is not None and (self.stock or self.kv_bytes < 1):
            raise ValueError("--kv-bytes needs a positive number of bytes and the native format (not --stock)")
        if self.cache_dtype is not None and (self.cache_dtype not in CACHE_DTYPES or self.stock):
            raise ValueError(
                f"cache_dtype (the folder's default cache) must be one of {', '.join(CACHE_DTYPES)}, native format only"
            )
        if self.cache_ratio is not None and self.kv_rank is not None:
            raise ValueError("give --cache-ratio or --kv-rank, not both")
        if self.kv_rope_dims is not None:
            if self.kv_bytes is None:
                raise ValueError("--kv-rope-dims says what --kv-bytes tries: give --kv-bytes too")
            bad = [d for d in self.kv_rope_dims if d != "all" and not (isinstance(d, int) and d >= 0 and d % 2 == 0)]
            if bad:
                raise ValueError(f"--kv-rope-dims takes even rope dims or 'all', got {', '.join(map(str, bad))}")
        if not 0 <= self.calib_chat <= 1:
            raise ValueError(f"calib_chat is a share of the calibration tokens, in 0..1; got {self.calib_chat}")
        if not self.calib_weight > 0:
            raise ValueError(f"calib_weight must be positive, got {self.calib_weight}")
        if self.rope_window is not None and self.rope_window < 1:
            raise ValueError(f"rope_window must be a positive number of tokens (or None: all), got {self.rope_window}")
        if self.refine_steps < 0:
            raise ValueError(f"refine_steps must be 0 (off) or a positive number of steps, got {self.refine_steps}")
        if not self.refine_lr > 0:
            raise ValueError(f"refine_lr must be positive, got {self.refine_lr}")
        if self.refine_inputs not in INPUTS:
            raise ValueError(f"refine_inputs must be one of {', '.join(INPUTS)}, got {self.refine_inputs!r}")
        if self.k_weight <= 0:
            raise ValueError(f"k_weight must be positive, got {self.k_weight}")


def rope_dim_arg(text: str):
    """A command line's rope dim: an even int or "all"."""
    return text if text == "all" else int(text)


def rope_window_arg(text: str):
    """A command line's rope window: a number of tokens or "all" (None)."""
    return None if text == "all" else int(text)


def calib_torch_dtype(name: str) -> torch.dtype:
    """The calibration forward's dtype: "auto" is bfloat16 only where the hardware has it natively
    (measured: same converted perplexity as float32, docs/conversion.md), never a guess."""
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() or cpu.native_bf16() else torch.float32
    return MODEL_DTYPES[name]
