"""Templates (`--warm FILE`): frequent prompts prefilled at start-up, their blocks pinned in
RAM up to `warm_fraction` of the cache, and (with a store) written to disk.

FILE is JSONL, one template a line, any of:

    "a plain prompt"
    {"prompt": "a plain prompt"}
    {"prompt_token_ids": [1, 2, 3]}
    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}]}

A conversation is rendered with the model's chat template *with* the assistant prompt,
so a request with the same conversation so far shares every full block of it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

from latentkv.cache.block_pool import hash_full_blocks
from latentkv.engine.chat_template import render_chat
from latentkv.sampling_params import SamplingParams


def read_templates(path: str | Path, tokenizer) -> list[list[int]]:
    """Token ids of each template in `path`; raises ValueError naming the file and line."""
    path = Path(path).expanduser()
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise ValueError(f"cannot read the warm file {path}: {err}") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            prompts.append(template_ids(json.loads(line), tokenizer))
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(
                f"{path}:{number}: not a template ({err}); expected a JSON string, "
                '{"prompt": ...}, {"prompt_token_ids": [...]} or {"messages": [...]}'
            ) from None
    return prompts


def template_ids(item, tokenizer) -> list[int]:
    if isinstance(item, dict) and "prompt_token_ids" in item:
        ids = item["prompt_token_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("prompt_token_ids must be a list of ints")
        return ids
    if tokenizer is None:
        raise ValueError("text templates need a tokenizer")
    if isinstance(item, dict) and "messages" in item:
        return render_chat(tokenizer, item["messages"])[1]
    text = item["prompt"] if isinstance(item, dict) else item
    if not isinstance(text, str):
        raise ValueError("the prompt must be a string")
    return tokenizer(text).input_ids


def warm_up(engine, path: str | Path, fraction: float) -> int:
    """Prefill every template in `path` (progress bar), then pin their full blocks, first
    templates first, up to `fraction` of the cache's blocks. -> blocks pinned.
    Pinned blocks are taken out of the engine's capacity, so no prompt can wait on them."""
    prompts = read_templates(path, engine.tokenizer)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    for i, ids in enumerate(prompts):
        try:
            engine.add_request(f"warm-{i}", None, params, prompt_token_ids=ids)
        except ValueError as err:
            raise ValueError(f"{path}: template {i + 1}: {err}") from None
    with tqdm(total=len(prompts), desc="warming templates", unit="prompt") as bar:
        while engine.has_unfinished_requests():
            bar.update(sum(out.finished for out in engine.step()))
    pin(engine, prompts, int(fraction * engine.pool.num_blocks))
    print(
        f"latentkv: warmed {len(prompts)} templates from {path}: {len(engine.pinned_blocks)} blocks pinned "
        f"(up to {fraction:.0%} of {engine.pool.num_blocks})",
        file=sys.stderr,
        flush=True,
    )
    return len(engine.pinned_blocks)


def pin(engine, prompts: list[list[int]], budget: int) -> None:
    pool, bs = engine.pool, engine.pool.block_size
    counts = pool.prefix_queries, pool.prefix_hits  # pinning is not traffic
    pinned = set(engine.pinned_blocks)
    for ids in prompts:
        hashes = hash_full_blocks(ids[: len(ids) // bs * bs], bs)
        new = [b for b in pool.match_prefix(hashes, ids) if b not in pinned][: budget - len(pinned)]
        pool.take(new)
        pinned.update(new)
        engine.pinned_blocks += new
    pool.prefix_queries, pool.prefix_hits = counts
    engine.capacity_tokens = (pool.num_blocks - len(engine.pinned_blocks)) * bs
