"""Batched sampling: one row of logits per sequence that picks a token this step.

Everything is tensor ops over the [N, vocab] batch. The only per-sequence Python is
building the parameter tensors and drawing noise for seeded requests: a seeded
request draws its noise from its own `torch.Generator`, so its tokens do not depend
on what else is in the batch.

Token choice uses the exponential race: argmax(p / E) with E ~ Exp(1) i.i.d. picks
index i with probability p_i — one batched argmax instead of per-row multinomial.

Logprobs are those of the raw model distribution (before penalties, temperature and
truncation), as in vLLM. A guided sequence's disallowed tokens are -inf before the choice
(each row's mask from its own matcher, latentkv/guided.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from latentkv.engine.outputs import Logprob, PositionLogprobs
from latentkv.engine.sequence import Sequence
from latentkv.guided import apply_guides


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[PositionLogprobs | None]   # per row; None where not asked
    chosen_logprobs: list[float | None]


def sample(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: list[int],
           generator: torch.Generator | None = None) -> SamplerOutput:
    """logits [N, V] float32, one row per sequence of `seqs` -> one token per row."""
    raw_logprobs = None
    want_logprobs = [s.params.logprobs is not None for s in seqs]
    if any(want_logprobs):
        raw_logprobs = torch.log_softmax(logits.float(), dim=-1)
    logits = apply_penalties(logits.float(), seqs)
    logits = mask_guided(logits, seqs, eos_token_ids)
    tokens = choose_tokens(logits, seqs, generator)
    out = SamplerOutput(tokens.tolist(), [None] * len(seqs), [None] * len(seqs))
    if raw_logprobs is not None:
        rows = [i for i, w in enumerate(want_logprobs) if w]
        top_n = [seqs[i].params.logprobs for i in rows]
        dicts, chosen = gather_logprobs(raw_logprobs[rows], tokens[rows], top_n)
        for i, d, c in zip(rows, dicts, chosen):
            out.logprobs[i], out.chosen_logprobs[i] = d, c
    return out


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Repetition (prompt + output tokens), presence and frequency (output tokens) penalties."""
    rep = [s.params.repetition_penalty for s in seqs]
    pres = [s.params.presence_penalty for s in seqs]
    freq = [s.params.frequency_penalty for s in seqs]
    if all(r == 1.0 for r in rep) and not any(pres) and not any(freq):
        return logits
    n, vocab = logits.shape
    device = logits.device
    counts = token_counts([s.output_token_ids for s in seqs], vocab, device)
    if any(r != 1.0 for r in rep):
        seen = (counts + token_counts([s.prompt_token_ids for s in seqs], vocab, device)) > 0
        r = torch.tensor(rep, device=device)[:, None].expand_as(logits)
        penalized = torch.where(logits > 0, logits / r, logits * r)
        logits = torch.where(seen, penalized, logits)
    logits = logits - torch.tensor(freq, device=device)[:, None] * counts
    logits = logits - torch.tensor(pres, device=device)[:, None] * (counts > 0).float()
    return logits


def token_counts(id_lists: list[list[int]], vocab: int, device) -> torch.Tensor:
    """[N, vocab] float: how often each token id occurs in each list."""
    width = max((len(ids) for ids in id_lists), default=0)
    counts = torch.zeros(len(id_lists), vocab + 1, device=device)
    if width:
        padded = torch.full((len(id_lists), width), vocab, dtype=torch.long)
        for i, ids in enumerate(id_lists):
            padded[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        counts.scatter_add_(1, padded.to(device), torch.ones(padded.shape, device=device))
    return counts[:, :vocab]


def mask_guided(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: list[int]) -> torch.Tensor:
    """The grammar masks, then min_tokens' ban on stop tokens; where the two leave a guided row
    nothing (the grammar is complete, only EOS fits), the grammar wins."""
    guided = apply_guides(logits, [s.guide for s in seqs], eos_token_ids)
    masked = mask_early_stop_tokens(guided, seqs, eos_token_ids)
    if guided is logits:
        return masked
    empty = torch.isneginf(masked).all(dim=-1)
    return torch.where(empty[:, None], guided, masked) if bool(empty.any()) else masked


def mask_early_stop_tokens(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: list[int]) -> torch.Tensor:
    """Forbid EOS and stop_token_ids until a sequence has `min_tokens` outputs."""
    rows, cols = [], []
    for i, s in enumerate(seqs):
        if s.num_output_tokens < s.params.min_tokens:
            banned = set(s.params.stop_token_ids) | (set() if s.params.ignore_eos else set(eos_token_ids))
            banned = [t for t in banned if 0 <= t < logits.shape[1]]
            rows += [i] * len(banned)
            cols += banned
    if rows:
        logits = logits.clone()
        logits[rows, cols] = float("-inf")
    return logits


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim (the first maximum; NaN counts as the largest, as in argmax) ->
    [N] long. torch's max(dim).indices picks the same index ~3x faster on CPU than argmax (vectorized
    reduce: 32 x 49,152 logits 0.37 ms against 1.1 ms)."""
    return x.max(dim=-1).indices


def finite_rows(logits: torch.Tensor) -> list[bool]:
    """[N, V] float32 -> per row: no NaN or +-inf. A row that holds one sums to NaN or +-inf, so a
    finite sum clears the row in one reduction (0.12 ms at 32 x 49,152 on 2 threads, where isfinite
    over every logit took 1.9 ms and a sum of a scaled copy 0.6); only a row whose sum is not
    finite, which a finite row of huge logits can be by overflow, is checked logit by logit."""
    finite = torch.isfinite(logits.sum(dim=-1)).tolist()
    for i, ok in enumerate(finite):
        if not ok:
            finite[i] = bool(torch.isfinite(logits[i]).all())
    return finite


def choose_tokens(logits: torch.Tensor, seqs: list[Sequence], generator: torch.Generator | None) -> torch.Tensor:
    """Greedy rows take the argmax; the others sample (temperature, top-k/p, min-p).
    Noise is drawn for sampling rows only, so greedy neighbours do not move the
    shared generator."""
    tokens = first_argmax(logits)
    rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if not rows:
        return tokens
    params = [seqs[i].params for i in rows]
    temperature = torch.tensor([p.temperature for p in params], device=logits.device)
    sub = truncate(logits[rows] / temperature[:, None], [p.top_k for p in params], [p.top_p for p in params],
                   [p.min_p for p in params])
    probs = torch.softmax(sub, dim=-1)
    noise = exponential_noise(probs.shape, [seqs[i] for i in rows], generator, probs.device)
    tokens[rows] = first_argmax(probs / noise)
    return tokens


def truncate(logits: torch.Tensor, top_k: list[int], top_p: list[float], min_p: list[float]) -> torch.Tensor:
    """Set to -inf every logit outside each row's top-k, top-p nucleus and min-p floor."""
    n, vocab = logits.shape
    device = logits.device
    if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=device)[None, :]
        # k past the vocabulary means "all" (and must not overflow an int64 tensor)
        k = torch.tensor([k if 0 < k < vocab else vocab for k in top_k], device=device)[:, None]
        drop = ranks >= k
        sorted_probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        # Keep a token while the mass strictly before it is below top_p (the top token always stays).
        drop |= mass_before >= torch.tensor(top_p, device=device)[:, None]
        drop[:, 0] = False
        logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    if any(p > 0.0 for p in min_p):
        probs = torch.softmax(logits, dim=-1)
        floor = torch.tensor(min_p, device=device)[:, None] * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def exponential_noise(shape, seqs: list[Sequence], generator: torch.Generator | None, device) -> torch.Tensor:
    """Exp(1) noise [N, V]; rows of seeded sequences come from their own generator (on CPU,
    so a seed gives the same tokens on every device)."""
    noise = torch.empty(shape, device=device)
    seeded = [i for i, s in enumerate(seqs) if s.generator is not None]
    unseeded = [i for i, s in enumerate(seqs) if s.generator is None]
    if unseeded:
        noise[unseeded] = torch.empty(len(unseeded), shape[1]).exponential_(generator=generator).to(device)
    for i in seeded:
        noise[i] = torch.empty(shape[1]).exponential_(generator=seqs[i].generator).to(device)
    return noise.clamp_min_(1e-30)  # a zero draw would turn p=0 into 0/0


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, top_n: list[int]):
    """logprobs [M, V], token_ids [M], top_n per row -> ([{id: Logprob}], [chosen logprob]).

    Each dict holds the row's `top_n` most likely tokens plus the actual token.
    """
    chosen = logprobs.gather(1, token_ids[:, None]).squeeze(1)
    ranks = (logprobs > chosen[:, None]).sum(dim=-1) + 1
    width = max(top_n, default=0)
    top_vals, top_ids = logprobs.topk(width, dim=-1) if width else (None, None)
    chosen_l, ranks_l, ids_l = chosen.tolist(), ranks.tolist(), token_ids.tolist()
    dicts = []
    for r, n in enumerate(top_n):
        d: PositionLogprobs = {}
        if n:
            for rank, (v, t) in enumerate(zip(top_vals[r, :n].tolist(), top_ids[r, :n].tolist()), start=1):
                d[t] = Logprob(v, rank)
        d[ids_l[r]] = Logprob(chosen_l[r], ranks_l[r])
        dicts.append(d)
    return dicts, chosen_l
