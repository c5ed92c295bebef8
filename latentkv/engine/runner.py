"""Model runner: owns the model and the paged latent caches; turns one scheduler step
into one flat batch, runs the model, and samples.

Logits are computed only for the rows that need them: the last new token of every
sequence that samples this step, plus every prompt position of sequences that asked
for prompt logprobs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from latentkv.attention.metadata import build_metadata
from latentkv.cache.accounting import latent_bytes_per_token
from latentkv.cache.latent_cache import allocate_caches
from latentkv.engine.outputs import PositionLogprobs
from latentkv.engine.sampler import finite_rows, gather_logprobs, sample
from latentkv.engine.scheduler import SchedulerOutput
from latentkv.facts import dtype_name
from latentkv.model import decode_plan
from latentkv.sizes import available_memory


def bytes_per_block(cfg, block_size: int, dtype: torch.dtype, cache_dtype: str) -> int:
    """Bytes of one block across all layers (latent + rope + scales), from the KV accounting."""
    return latent_bytes_per_token(cfg, cache_dtype, dtype_name(dtype)) * block_size


@dataclass
class SeqResult:
    """What one scheduled sequence got from a step (`ModelRunner.run` returns one per
    scheduled sequence, in the scheduled order)."""

    token: int | None = None  # None: this chunk did not reach the end
    logprobs: PositionLogprobs | None = None  # of the token, when asked for
    chosen_logprob: float | None = None
    prompt_logprobs: list[PositionLogprobs] | None = None  # newly scored prompt positions
    nonfinite: bool = False  # its logits held NaN/Inf (with nan_check)


class ModelRunner:
    def __init__(
        self,
        model,
        block_size: int,
        num_blocks: int,
        cache_dtype: str = "auto",
        attention_path: str = "auto",
        seed: int = 0,
        nan_check: bool = False,
        eos_token_ids: list[int] | None = None,
        batch_invariant: bool = False,
    ):
        self.model = model
        self.cfg = model.config
        self.device = model.device
        self.dtype = model.dtype
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.attention_path = attention_path
        self.nan_check = nan_check
        self.batch_invariant = batch_invariant  # attention reduces each row in a fixed order (invariant.py)
        self.caches = allocate_caches(self.cfg, num_blocks, block_size, self.dtype, cache_dtype, self.device)
        self.generator = torch.Generator().manual_seed(seed)  # for unseeded requests
        self.eos_token_ids = eos_token_ids if eos_token_ids is not None else []  # masked until min_tokens
        self.plan = None  # model/decode_plan.py: all-decode steps in one native call (use_decode_plan)

    def use_decode_plan(self) -> str | None:
        """Replay all-decode steps through a decode plan over this runner's model and caches.
        Only for a model whose weights no longer change (the engine's own): the plan holds them.
        -> None, or why the plan does not apply (the modules run every step then)."""
        self.plan, reason = decode_plan.build(self.model, self.caches)
        return reason

    @torch.inference_mode()
    def run(self, out: SchedulerOutput) -> list[SeqResult]:
        """One step: a SeqResult per `out.scheduled` entry, in that order."""
        seqs = [s.seq for s in out.scheduled]
        starts = [seq.num_computed_tokens for seq in seqs]
        lens = [s.num_new_tokens for s in out.scheduled]
        input_ids = [t for seq, a, n in zip(seqs, starts, lens) for t in seq.token_ids[a : a + n]]
        batch, positions = build_metadata(
            lens,
            [a + n for a, n in zip(starts, lens)],
            [seq.block_table for seq in seqs],
            self.block_size,
            self.device,
            self.attention_path,
            invariant=self.batch_invariant,
            prompt_lens=[seq.num_prompt_tokens for seq in seqs],
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        if self.plan is not None and self.plan.applies(batch):
            hidden = self.plan(ids, positions, batch)  # the same kernels without the Python between them
        else:
            hidden = self.model(ids, positions, batch, self.caches)
        rows, plp_rows = self.pick_logit_rows(out, batch.query_start.tolist())
        results = [SeqResult() for _ in seqs]
        if not rows and not plp_rows:
            return results
        wanted = [r for _, r in rows] + [r for _, rs, _ in plp_rows for r in rs]
        logits = self.model.compute_logits(hidden[torch.tensor(wanted, device=self.device)])
        sample_logits = logits[: len(rows)]
        if rows:
            picked = sample(sample_logits, [seqs[b] for b, _ in rows], self.eos_token_ids, self.generator)
            finite = finite_rows(sample_logits) if self.nan_check else [True] * len(rows)
            for i, (b, _) in enumerate(rows):
                r = results[b]
                r.token, r.logprobs, r.chosen_logprob = (
                    picked.token_ids[i],
                    picked.logprobs[i],
                    picked.chosen_logprobs[i],
                )
                r.nonfinite = not finite[i]
        self.collect_prompt_logprobs(logits[len(rows) :], seqs, plp_rows, results)
        return results

    def pick_logit_rows(self, out: SchedulerOutput, query_start: list[int]):
        """-> [(batch index, flat row)] for picking a token; [(batch index, rows, first prompt
        position)] for prompt logprobs."""
        rows, plp_rows = [], []
        for b, s in enumerate(out.scheduled):
            seq = s.seq
            if s.picks_token:
                rows.append((b, query_start[b + 1] - 1))
            if seq.wants_prompt_logprobs:
                # logits at position p score prompt token p + 1; collect the ones not yet scored
                first = max(seq.num_computed_tokens, len(seq.prompt_logprobs) - 1)
                last = min(seq.num_computed_tokens + s.num_new_tokens, seq.num_prompt_tokens - 1)
                if last > first:
                    base = query_start[b] - seq.num_computed_tokens
                    plp_rows.append((b, list(range(base + first, base + last)), first))
        return rows, plp_rows

    def collect_prompt_logprobs(self, logits: torch.Tensor, seqs, plp_rows, results: list[SeqResult]) -> None:
        offset = 0
        for b, rows, first in plp_rows:
            seq = seqs[b]
            lp = torch.log_softmax(logits[offset : offset + len(rows)], dim=-1)
            targets = torch.tensor(seq.token_ids[first + 1 : first + 1 + len(rows)], device=lp.device)
            dicts, _ = gather_logprobs(lp, targets, [seq.params.prompt_logprobs] * len(rows))
            results[b].prompt_logprobs = dicts
            offset += len(rows)

    def scrub_blocks(self, block_ids: list[int]) -> None:
        """Zero blocks that may hold NaN/Inf latents: attention reads padded and not yet
        written slots under a mask, and 0 × NaN would still poison other sequences."""
        if not block_ids:
            return
        index = torch.tensor(block_ids, device=self.device)
        for cache in self.caches:
            for t in cache.tensors():
                t[index] = 0


def plan_num_blocks(
    cfg,
    block_size: int,
    dtype: torch.dtype,
    cache_dtype: str,
    device: torch.device,
    kv_cache_memory: int | None = None,
    kv_cache_blocks: int | None = None,
    kv_cache_fraction: float | None = None,
    max_useful_blocks: int | None = None,
) -> tuple[int, int]:
    """-> (num_blocks, bytes per block). `kv_cache_blocks` or a byte budget are used as given;
    otherwise a fraction of the memory free now, capped at the `max_useful_blocks` that could
    ever be in use."""
    per_block = bytes_per_block(cfg, block_size, dtype, cache_dtype)
    if kv_cache_blocks is not None:
        return kv_cache_blocks, per_block
    if kv_cache_memory is not None:
        budget = kv_cache_memory
    else:
        fraction = kv_cache_fraction if kv_cache_fraction is not None else (0.9 if device.type == "cuda" else 0.25)
        budget = int(available_memory(device) * fraction)
        if max_useful_blocks:
            budget = min(budget, max_useful_blocks * per_block)
    num_blocks = budget // per_block
    if num_blocks < 1:
        raise ValueError(
            f"KV cache budget of {budget} bytes holds no block ({per_block} bytes per "
            f"{block_size}-token block); raise kv_cache_memory"
        )
    return num_blocks, per_block


def report_capacity(num_blocks: int, block_size: int, per_block: int, cache_dtype: str) -> None:
    tokens = num_blocks * block_size
    print(
        f"latentkv: KV cache {num_blocks} blocks x {block_size} tokens = {tokens} tokens "
        f"({num_blocks * per_block / 2**20:.1f} MiB, {per_block / block_size:.0f} bytes/token, {cache_dtype})",
        file=sys.stderr,
    )
