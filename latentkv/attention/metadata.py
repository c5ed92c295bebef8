"""The attention metadata of one flat, token-major batch (the runner builds it, backends read it).

A step feeds T new tokens from B sequences; each sequence has `query_len` new tokens
at the end of `context_len` tokens whose latents are (after this step's writes) in the
paged cache. Padded per-sequence views ([B, Qmax]) let attention run as a few tensor
ops with no Python loop over sequences or tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    query_start: torch.Tensor  # [B+1] offsets of each sequence's new tokens in the flat batch
    context_lens: torch.Tensor  # [B] tokens in cache after this step's writes
    block_tables: torch.Tensor  # [B, nb] physical block ids, only as many columns as needed
    slot_mapping: torch.Tensor  # [T] flat cache slot of each new token
    query_index: torch.Tensor  # [B, Qmax] flat token index of each padded query (0 where padding)
    query_valid: torch.Tensor  # [B, Qmax] bool
    query_pos: torch.Tensor  # [B, Qmax] absolute position of each padded query
    max_query_len: int
    max_context_len: int
    path: str = "auto"  # "naive" | "absorbed" | "auto"
    runs: list[tuple[int, int]] | None = None  # one sequence: its blocks as (first, count) runs of consecutive ids
    groups: list | None = (
        None  # [(flat rows: slice or [n], AttentionMetadata)]: attend per group (see attention_groups)
    )
    invariant: bool = False  # every row reduces in a fixed order of its own (latentkv/invariant.py)
    prompt_rows: list[int] | None = None  # invariant: per sequence, how many of its new rows are prompt tokens
    _masks: dict = field(default_factory=dict, repr=False)

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]

    @property
    def mask_kind(self) -> str:
        """ "none": one sequence decoding (every cached key is visible); "causal": one
        sequence prefilled from scratch (SDPA's own causal mask, no tensor); else "explicit"."""
        if self.num_seqs == 1 and self.max_query_len == 1:
            return "none"
        if self.num_seqs == 1 and self.max_query_len == self.max_context_len:
            return "causal"
        return "explicit"

    def key_mask(self, key_len: int, heads: int = 1) -> torch.Tensor:
        """[B, 1, Qmax*heads, L] bool: key j is visible to a query at position p iff j <= p
        (query rows repeated `heads` times for the absorbed path). Built once per step."""
        if (key_len, heads) not in self._masks:
            keys = torch.arange(key_len, device=self.query_pos.device)
            mask = keys[None, None, :] <= self.query_pos[:, :, None]
            if heads > 1:
                mask = mask[:, :, None, :].expand(-1, -1, heads, -1).flatten(1, 2)
            self._masks[(key_len, heads)] = mask[:, None]
        return self._masks[(key_len, heads)]


def build_metadata(
    query_lens: list[int],
    context_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    path: str = "auto",
    split: bool = True,
    invariant: bool = False,
    prompt_lens: list[int] | None = None,
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Build the metadata and the positions [T] of the new tokens.

    query_lens[b] new tokens of sequence b sit at positions
    context_lens[b] - query_lens[b] .. context_lens[b] - 1. With `invariant`, positions below
    prompt_lens[b] are prompt rows (the invariant naive path, attention/prefill.py), the others
    decode rows (the absorbed kernel); without prompt_lens a multi-token query is all prompt.
    """
    if not (len(query_lens) == len(context_lens) == len(block_tables)):
        raise ValueError("query_lens, context_lens and block_tables must have one entry per sequence")
    if query_lens and all(q == 1 for q in query_lens) and all(c >= 1 for c in context_lens):
        return decode_metadata(context_lens, block_tables, block_size, device, path, split, invariant, prompt_lens)
    return general_metadata(
        query_lens, context_lens, block_tables, block_size, device, path, split, invariant, prompt_lens
    )


def general_metadata(
    query_lens, context_lens, block_tables, block_size, device, path, split, invariant, prompt_lens
) -> tuple[AttentionMetadata, torch.Tensor]:
    """build_metadata for any step (decode_metadata is its fast path for single-token rows)."""
    q = torch.tensor(query_lens, dtype=torch.long)
    ctx = torch.tensor(context_lens, dtype=torch.long)
    if bool((q <= 0).any()) or bool((q > ctx).any()):
        raise ValueError("each sequence needs 0 < query_len <= context_len")
    q_max, ctx_max = int(q.max()), int(ctx.max())
    num_blocks = -(-ctx_max // block_size)
    tables = torch.zeros(len(block_tables), num_blocks, dtype=torch.long)
    for b, table in enumerate(block_tables):
        need = blocks_needed(b, table, context_lens[b], block_size)
        tables[b, :need] = torch.tensor(table[:need], dtype=torch.long)

    query_start = torch.zeros(len(query_lens) + 1, dtype=torch.long)
    query_start[1:] = q.cumsum(0)
    offsets = torch.arange(q_max)
    valid = offsets[None, :] < q[:, None]
    query_pos = (ctx - q)[:, None] + offsets[None, :]
    query_index = torch.where(valid, query_start[:-1, None] + offsets[None, :], torch.zeros_like(query_pos))
    query_pos = torch.where(valid, query_pos, torch.zeros_like(query_pos))

    positions = query_pos[valid]  # row-major over (b, i): the flat order
    seq_of = torch.repeat_interleave(torch.arange(len(query_lens)), q)
    block_ids = tables[seq_of, positions // block_size]
    slot_mapping = block_ids * block_size + positions % block_size

    batch = AttentionMetadata(
        query_start=query_start.to(device),
        context_lens=ctx.to(device),
        block_tables=tables.to(device),
        slot_mapping=slot_mapping.to(device),
        query_index=query_index.to(device),
        query_valid=valid.to(device),
        query_pos=query_pos.to(device),
        max_query_len=q_max,
        max_context_len=ctx_max,
        path=path,
        runs=block_runs(tables[0].tolist()) if len(block_tables) == 1 else None,
        invariant=invariant,
    )
    prompt = [0] * len(query_lens)
    if invariant:
        if prompt_lens is None:
            prompt_lens = [c if q > 1 else 0 for q, c in zip(query_lens, context_lens)]
        prompt = [min(max(p - (c - q), 0), q) for p, q, c in zip(prompt_lens, query_lens, context_lens)]
        batch.prompt_rows = prompt if any(prompt) else None
    # equal lengths pad nothing: one batch; but each prompt goes alone (prefill.py takes one sequence)
    if split and (q_max > 1 and len(set(query_lens)) > 1 or len(query_lens) > 1 and any(prompt)):
        batch.groups = attention_groups(
            query_lens, context_lens, block_tables, block_size, device, path, invariant, prompt
        )
    return batch, positions.to(device)


def blocks_needed(b: int, table: list[int], context_len: int, block_size: int) -> int:
    """Blocks sequence b's context needs; a ValueError when its table has fewer."""
    need = -(-context_len // block_size)
    if len(table) < need:
        raise ValueError(f"sequence {b} has {len(table)} blocks; {need} needed for {context_len} tokens")
    return need


def decode_metadata(
    context_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device,
    path: str,
    split: bool,
    invariant: bool,
    prompt_lens: list[int] | None,
) -> tuple[AttentionMetadata, torch.Tensor]:
    """build_metadata for a step of single-token rows (every decode step): the same fields from
    Python lists and a handful of tensors. The general path's ~25 small tensor ops took ~0.7 ms
    of a 16 ms batch-1 step (2 threads); the fields are equal (tests/attention/test_metadata.py)."""
    B, width = len(context_lens), -(-max(context_lens) // block_size)
    rows, slots = [], []
    for b, (table, ctx) in enumerate(zip(block_tables, context_lens)):
        need = blocks_needed(b, table, ctx, block_size)
        rows.append(table[:need] + [0] * (width - need))
        slots.append(table[(ctx - 1) // block_size] * block_size + (ctx - 1) % block_size)
    pos = torch.tensor([c - 1 for c in context_lens], dtype=torch.long)
    steps = torch.arange(B + 1)
    batch = AttentionMetadata(
        query_start=steps.to(device),
        context_lens=torch.tensor(context_lens, dtype=torch.long, device=device),
        block_tables=torch.tensor(rows, dtype=torch.long, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        query_index=steps[:-1, None].to(device),
        query_valid=torch.ones(B, 1, dtype=torch.bool, device=device),
        query_pos=pos[:, None].to(device),
        max_query_len=1,
        max_context_len=max(context_lens),
        path=path,
        runs=block_runs(rows[0]) if B == 1 else None,
        invariant=invariant,
    )
    if invariant:  # a decode row is a prompt row only while its position is below the prompt's length
        prompt = [int(p > c - 1) for p, c in zip(prompt_lens or [0] * B, context_lens)]
        batch.prompt_rows = prompt if any(prompt) else None
        if split and B > 1 and any(prompt):
            batch.groups = attention_groups(
                [1] * B, context_lens, block_tables, block_size, device, path, invariant, prompt
            )
    return batch, pos.to(device)


def attention_groups(
    query_lens, context_lens, block_tables, block_size, device, path, invariant=False, prompt_rows=None
) -> list:
    """Padded attention pays for Qmax query rows per sequence: a step mixing a prefill chunk of
    2,048 tokens with decodes would attend 2,048 rows for every decode. So such steps attend per
    group — each sequence with several new tokens (or with prompt rows) alone, all single-token
    decodes together — while the linears still run once on the whole flat batch. -> [(flat rows, batch)],
    the rows a slice where they are consecutive, else an index tensor."""
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    prompt_rows = prompt_rows or [0] * len(query_lens)
    alone = [q > 1 or p > 0 for q, p in zip(query_lens, prompt_rows)]
    decodes = [i for i in range(len(query_lens)) if not alone[i]]
    members = [[i] for i in range(len(query_lens)) if alone[i]] + ([decodes] if decodes else [])
    groups = []
    for seqs in members:
        flat = [r for i in seqs for r in range(starts[i], starts[i + 1])]
        # consecutive rows (every sequence alone) as a slice: a view in, a copy out, where an index
        # tensor gathered and scattered them (~7% of a prefill step of 8 x 256 prompts)
        contiguous = flat == list(range(flat[0], flat[-1] + 1))
        rows = slice(flat[0], flat[-1] + 1) if contiguous else torch.tensor(flat, device=device)
        # prompt lengths that give each sequence the same prompt rows again
        prompts = [context_lens[i] - query_lens[i] + prompt_rows[i] for i in seqs]
        sub, _ = build_metadata(
            [query_lens[i] for i in seqs],
            [context_lens[i] for i in seqs],
            [block_tables[i] for i in seqs],
            block_size,
            device,
            path,
            split=False,
            invariant=invariant,
            prompt_lens=prompts,
        )
        groups.append((rows, sub))
    return groups


MAX_RUNS = 8  # more pieces than this and one gather copy is cheaper than many small matmuls


def block_runs(table: list[int]) -> list[tuple[int, int]] | None:
    """[3, 4, 5, 9, 10] -> [(3, 3), (9, 2)]: the cache is read as a view per run (no copy);
    None when the table is too fragmented."""
    runs: list[tuple[int, int]] = []
    for block in table:
        if runs and runs[-1][0] + runs[-1][1] == block:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((block, 1))
    return runs if len(runs) <= MAX_RUNS else None
