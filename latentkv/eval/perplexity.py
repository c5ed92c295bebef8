"""Perplexity over non-overlapping windows: every window of `ctx` tokens is scored from
its own start (no context carried across windows), and the first token of a window is
not predicted. PPL = exp(mean negative log-likelihood over the predicted tokens).

The protocol alone (no model loading): `latentkv eval ppl` (scorer.py) and the converter
both score with it, so their numbers are the same numbers.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

PROTOCOL = (
    "non-overlapping windows of {ctx} tokens, each scored from its own start; "
    "the first token of each window is not predicted; ppl = exp(mean NLL)"
)


def window_ids(ids: list[int], ctx: int, max_windows: int | None = None) -> torch.Tensor:
    """[N, ctx] windows of a token list (the tail shorter than ctx is dropped)."""
    n = len(ids) // ctx
    if max_windows is not None:
        n = min(n, max_windows)
    if n == 0:
        raise ValueError(f"text too short: {len(ids)} tokens, need at least one window of {ctx}")
    return torch.tensor(ids[: n * ctx]).view(n, ctx)


def text_windows(tokenizer, text: str, ctx: int, max_tokens: int | None = None) -> torch.Tensor:
    """[N, ctx] windows of a text's tokens (at most max_tokens // ctx of them, at least one)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return window_ids(ids, ctx, None if max_tokens is None else max(1, max_tokens // ctx))


def window_nll(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """Summed NLL of the predicted tokens of ids [B, T] (all but each window's first) under logits [B, T, vocab]."""
    logits = logits.float()
    return float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"))


def summary(total: float, count: int, ctx: int) -> dict:
    return {"ppl": math.exp(total / count), "nll": total / count, "tokens": count, "ctx": ctx}


@torch.no_grad()
def perplexity(
    logits_fn: Callable[[torch.Tensor], torch.Tensor], windows: torch.Tensor, batch: int = 1, desc: str = "perplexity"
) -> dict:
    """{"ppl", "nll", "tokens", "ctx"} of logits_fn(ids [B, T]) -> [B, T, vocab] over windows [N, T]."""
    total, count = 0.0, 0
    for b in tqdm(range(0, windows.shape[0], batch), desc=desc, unit="window", leave=False):
        ids = windows[b : b + batch]
        total += window_nll(logits_fn(ids), ids)
        count += ids[:, 1:].numel()
    return summary(total, count, windows.shape[1])


@torch.no_grad()
def layerwise_perplexity(
    embed: Callable[[torch.Tensor], torch.Tensor],
    layers: Iterable[Callable],
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    windows: torch.Tensor,
    desc: str = "perplexity",
) -> dict:
    """perplexity() of a model run one layer at a time over all windows: embed(ids [1, T]) -> hidden
    [1, T, D]; `layers` yields each layer as a function hidden -> hidden (a generator may load a
    layer's weights before yielding it and free them after), logits_fn(hidden) -> [1, T, vocab].
    Holds the residual stream of every window (N·T·D), one layer and one window's logits."""
    hidden = [embed(ids) for ids in windows.split(1)]
    for layer in tqdm(layers, desc=desc, unit="layer", leave=False):
        hidden = [layer(h) for h in hidden]
    total, count = 0.0, 0
    for ids, h in zip(windows.split(1), hidden):
        total += window_nll(logits_fn(h), ids)
        count += ids[:, 1:].numel()
    return summary(total, count, windows.shape[1])
