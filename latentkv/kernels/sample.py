"""The batched sampler's kernel (csrc/sample/): one token per row of float32 logits under the row's
temperature, top_k, top_p and min_p, drawn by inverse CDF with one uniform per row. No sort of the
vocabulary (a histogram finds the top-k / top-p cut; sample_impl.h); rows in parallel, each alone.
And the rows' log-probabilities (the chosen token's, its rank, the top n) without a [N, V] log_softmax,
and the penalties on each row's seen tokens (no [N, V] count table).
engine/sampler.py holds the PyTorch reference (`truncate` + the same inverse CDF) and decides when
this runs.

Paths: avx512, avx2, scalar (the same loops auto-vectorized per target), under the capabilities that
serve (EXT.caps, kernels/build.py) or those a named `path` needs. LATENTKV_SAMPLE_KERNEL=0
switches the extension off.
"""

from __future__ import annotations

import torch

from .build import Extension


def probe(module, caps: int) -> list:
    """The self-check's inputs (kernels/build.py): the tokens of rows under every kind of truncation,
    exactly the scalar path's (random logits put no cut or draw within rounding of a boundary)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 3000, generator=gen) * 2.0
    logits[3, ::7] = float("-inf")  # a guided row's mask
    logits[5, 100:200] = logits[5].max()  # ties at the top
    n = 24
    rows = torch.arange(n) % 8
    temperature = torch.tensor([1.0, 0.7, 1.3, 0.5] * 6)
    top_k = torch.tensor([0, 50, 0, 3000, 1, 120] * 4)
    top_p = torch.tensor([1.0, 0.9, 0.5, 1.0, 0.95, 0.3, 1.0, 0.8] * 3)
    min_p = torch.tensor([0.0, 0.0, 0.05, 0.0, 0.2, 0.0] * 4)
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    tokens = module.sample_rows(logits, rows, temperature, top_k, top_p, min_p, u, torch.empty(0), caps)
    return [("sample_rows", tokens.double(), 0.0)]


EXT = Extension(
    "sample",
    "latentkv_sample",
    "sample.cpp",
    "LATENTKV_SAMPLE_KERNEL",
    "the native sampler is",
    "the PyTorch sampler",
    probe,
)


def available() -> bool:
    return EXT.available()


def caps_mask(path: str | None) -> int:
    """The mask an entry is handed: the capabilities that serve, or those `path` needs."""
    return (EXT.caps if path is None else EXT.path_caps(path)).mask


def unavailable_reason() -> str | None:
    return EXT.unavailable_reason()


def sample_rows(
    logits: torch.Tensor,
    rows: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    u: torch.Tensor,
    path: str | None = None,
    kept: torch.Tensor | None = None,
) -> torch.Tensor:
    """logits [R, V] float32 (rows contiguous), rows [N] int64 (which logit rows), temperature [N] float32 > 0,
    top_k [N] int64 (0: off), top_p [N] float32 in (0, 1], min_p [N] float32 in [0, 1], u [N] float64 in
    [0, 1) -> tokens [N] int64. `path`: a named path (default: the one that serves); `kept` [N, V] float32, if
    given, gets each row's weights after truncation (e^((l - max) / T), 0 where dropped)."""
    return EXT.module().sample_rows(
        logits,
        rows,
        temperature,
        top_k,
        top_p,
        min_p,
        u,
        torch.empty(0) if kept is None else kept,
        caps_mask(path),
    )


def logprob_rows(logits: torch.Tensor, rows: torch.Tensor, chosen: torch.Tensor, n: int, path: str | None = None):
    """logits [R, V] float32 (rows contiguous), rows [N] int64, chosen [N] int64 token ids, n >= 0 ->
    (chosen logprob [N] float32, rank [N] int64, top values [N, n] float32, top ids [N, n] int64) of the
    raw distribution (log_softmax of each row; the top n by value, ties by the lower index)."""
    return EXT.module().logprob_rows(logits, rows, chosen, n, caps_mask(path))


def penalize_rows(
    logits: torch.Tensor,
    ids: torch.Tensor,
    lens: torch.Tensor,
    prompt_lens: torch.Tensor,
    rep: torch.Tensor,
    pres: torch.Tensor,
    freq: torch.Tensor,
) -> torch.Tensor:
    """logits [N, V] float32; ids: each row's token ids (prompt, then output) one row after another, int64;
    lens, prompt_lens [N] int64; rep, pres, freq [N] float32 -> a new [N, V]: the logits with each row's
    repetition (prompt + output), frequency and presence (output) penalties, torch's float32 bits."""
    return EXT.module().penalize_rows(logits, ids, lens, prompt_lens, rep, pres, freq)
