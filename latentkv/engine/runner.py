"""Model runner: owns the model and the paged latent caches; turns one scheduler step
into one flat batch, runs the model, and samples.

Logits are computed only for the rows that need them: the last new token of every
sequence that samples this step, plus every prompt position of sequences that asked
for prompt logprobs.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

import torch

from latentkv.cache.latent_cache import allocate_caches
from latentkv.engine.outputs import PositionLogprobs
from latentkv.engine.sampler import SamplerOutput, gather_logprobs, sample
from latentkv.engine.scheduler import SchedulerOutput
from latentkv.engine.sequence import Sequence
from latentkv.attention.metadata import build_metadata

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_memory(value: int | float | str) -> int:
    """Bytes from an int or a string such as "2GiB", "512 MiB", "1.5GB", "4096"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"kv_cache_memory must be positive, got {value}")
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read a memory size from {value!r}; use bytes or e.g. '512MiB', '2GiB'")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size <= 0:
        raise ValueError(f"kv_cache_memory must be positive, got {value!r}")
    return size


def available_memory(device: torch.device) -> int:
    """Free bytes on `device` now (CUDA: mem_get_info; CPU: MemAvailable)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def bytes_per_block(cfg, block_size: int, dtype: torch.dtype, cache_dtype: str) -> int:
    """Bytes of one block across all layers (latent + rope + scales), from the KV accounting."""
    from latentkv.cache.accounting import latent_bytes_per_token
    return latent_bytes_per_token(cfg, cache_dtype, str(dtype).removeprefix("torch.")) * block_size


@dataclass
class StepResult:
    samples: dict[int, tuple[int, PositionLogprobs | None, float | None]] = field(default_factory=dict)
    prompt_logprobs: dict[int, list[PositionLogprobs]] = field(default_factory=dict)
    nonfinite: set[int] = field(default_factory=set)   # id(seq) whose logits had NaN/Inf


class ModelRunner:
    def __init__(self, model, block_size: int, num_blocks: int, cache_dtype: str = "auto",
                 attention_path: str = "auto", seed: int = 0, nan_check: bool = False):
        self.model = model
        self.cfg = model.config
        self.device = model.device
        self.dtype = model.dtype
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.attention_path = attention_path
        self.nan_check = nan_check
        self.caches = allocate_caches(self.cfg, num_blocks, block_size, self.dtype, cache_dtype, self.device)
        self.generator = torch.Generator().manual_seed(seed)   # for unseeded requests
        self.eos_token_ids: list[int] = []

    @torch.inference_mode()
    def run(self, out: SchedulerOutput) -> StepResult:
        seqs = [s.seq for s in out.scheduled]
        starts = [seq.num_computed_tokens for seq in seqs]
        lens = [s.num_new_tokens for s in out.scheduled]
        input_ids = [t for seq, a, n in zip(seqs, starts, lens) for t in seq.token_ids[a:a + n]]
        batch, positions = build_metadata(lens, [a + n for a, n in zip(starts, lens)],
                                          [seq.block_table for seq in seqs], self.block_size,
                                          self.device, self.attention_path)
        hidden = self.model(torch.tensor(input_ids, dtype=torch.long, device=self.device), positions, batch, self.caches)
        rows, plp_rows = self.pick_logit_rows(out, batch.query_start.tolist())
        result = StepResult()
        if not rows and not plp_rows:
            return result
        wanted = [r for _, r in rows] + [r for _, rs, _ in plp_rows for r in rs]
        logits = self.model.compute_logits(hidden[torch.tensor(wanted, device=self.device)])
        sample_logits = logits[:len(rows)]
        if self.nan_check:
            finite = torch.isfinite(sample_logits).all(dim=-1).tolist()
            result.nonfinite = {id(seq) for (seq, _), ok in zip(rows, finite) if not ok}
        if rows:
            sampled = sample(sample_logits, [seq for seq, _ in rows], self.eos_token_ids, self.generator)
            for i, (seq, _) in enumerate(rows):
                result.samples[id(seq)] = (sampled.token_ids[i], sampled.logprobs[i], sampled.chosen_logprobs[i])
        self.collect_prompt_logprobs(logits[len(rows):], plp_rows, result)
        return result

    def pick_logit_rows(self, out: SchedulerOutput, query_start: list[int]):
        """-> [(seq, flat row)] for sampling; [(seq, rows, first prompt position)] for prompt logprobs."""
        rows, plp_rows = [], []
        for b, s in enumerate(out.scheduled):
            seq = s.seq
            if s.samples:
                rows.append((seq, query_start[b + 1] - 1))
            if seq.wants_prompt_logprobs:
                # logits at position p score prompt token p + 1; collect the ones not yet scored
                first = max(seq.num_computed_tokens, len(seq.prompt_logprobs) - 1)
                last = min(seq.num_computed_tokens + s.num_new_tokens, seq.num_prompt_tokens - 1)
                if last > first:
                    base = query_start[b] - seq.num_computed_tokens
                    plp_rows.append((seq, list(range(base + first, base + last)), first))
        return rows, plp_rows

    def collect_prompt_logprobs(self, logits: torch.Tensor, plp_rows, result: StepResult) -> None:
        offset = 0
        for seq, rows, first in plp_rows:
            lp = torch.log_softmax(logits[offset:offset + len(rows)], dim=-1)
            targets = torch.tensor(seq.token_ids[first + 1:first + 1 + len(rows)], device=lp.device)
            dicts, _ = gather_logprobs(lp, targets, [seq.params.prompt_logprobs] * len(rows))
            result.prompt_logprobs[id(seq)] = dicts
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


def plan_num_blocks(cfg, block_size: int, dtype: torch.dtype, cache_dtype: str, device: torch.device,
                    kv_cache_memory=None, kv_cache_fraction: float | None = None,
                    max_useful_blocks: int | None = None) -> tuple[int, int]:
    """-> (num_blocks, bytes per block). An explicit byte budget is used as given; otherwise a
    fraction of the memory free now, capped at the `max_useful_blocks` that could ever be in use."""
    per_block = bytes_per_block(cfg, block_size, dtype, cache_dtype)
    if kv_cache_memory is not None:
        budget = parse_memory(kv_cache_memory)
    else:
        fraction = kv_cache_fraction if kv_cache_fraction is not None else (0.9 if device.type == "cuda" else 0.25)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"kv_cache_fraction must be in (0, 1], got {fraction}")
        budget = int(available_memory(device) * fraction)
        if max_useful_blocks:
            budget = min(budget, max_useful_blocks * per_block)
    num_blocks = budget // per_block
    if num_blocks < 1:
        raise ValueError(f"KV cache budget of {budget} bytes holds no block ({per_block} bytes per "
                         f"{block_size}-token block); raise kv_cache_memory")
    return num_blocks, per_block


def report_capacity(num_blocks: int, block_size: int, per_block: int, cache_dtype: str) -> None:
    tokens = num_blocks * block_size
    print(f"latentkv: KV cache {num_blocks} blocks x {block_size} tokens = {tokens} tokens "
          f"({num_blocks * per_block / 2**20:.1f} MiB, {per_block / block_size:.0f} bytes/token, {cache_dtype})",
          file=sys.stderr)
