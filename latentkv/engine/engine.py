"""`LLMEngine`: the step loop behind `LLM` and the server (vLLM's engine API shape).

add_request -> Sequence(s) in the scheduler's waiting queue; step() = schedule, run
the model, sample, then per sampled token: append, detokenize, check stop conditions,
free finished sequences; it returns a cumulative `RequestOutput` for every request
that produced a token (or finished) in this step.

A failure inside a step fails only the sequences it belongs to (see engine/isolation.py):
when the batched model run raises, the step is rerun one sequence at a time, the ones
that still fail finish with finish_reason "error" (their blocks freed and scrubbed), and
the others carry on as if nothing happened. That holds for bugs nobody has found yet.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

import torch

from latentkv import invariant
from latentkv.cache.block_pool import BlockPool
from latentkv.config import ModelConfig
from latentkv.cpu import default_threads, threads_from_env
from latentkv.engine.args import BATCHED_TOKENS, EngineArgs
from latentkv.engine.detokenizer import detokenize_incrementally, find_stop_string, visible_text
from latentkv.engine.folder import find_eos_token_ids, load_tokenizer, with_folder_cache
from latentkv.engine.isolation import describe_failure, run_isolated
from latentkv.engine.kv_manager import KVManager
from latentkv.engine.outputs import CompletionOutput, RequestOutput
from latentkv.engine.prompt_errors import PromptError, check_token_ids
from latentkv.engine.route import describe as describe_route
from latentkv.engine.runner import ModelRunner, SeqResult, plan_num_blocks, report_capacity
from latentkv.engine.scheduler import Scheduler, SchedulerOutput
from latentkv.engine.sequence import Sequence
from latentkv.guided import Guides, advance
from latentkv.kernels import sample as sample_kernel
from latentkv.kernels.build import build_in_background
from latentkv.engine.threads import ThreadGovernor
from latentkv.engine.warm import warm_up
from latentkv.model.loader import load_model, resolve_dtype
from latentkv.model.route import decide_route
from latentkv.sampling_params import SamplingParams
from latentkv.sizes import keep_freed_memory
from latentkv.store.tier import open_tier

__all__ = ["EngineArgs", "LLMEngine"]


class LLMEngine:
    def __init__(self, args: EngineArgs, model, tokenizer):
        """args: checked when built, kv_cache_dtype as served (with_folder_cache: from_args resolves it)."""
        self.args = args
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = model.config
        device = model.device
        max_model_len = args.max_model_len or self.cfg.max_position_embeddings
        num_blocks, per_block = plan_num_blocks(
            self.cfg,
            args.block_size,
            model.dtype,
            args.kv_cache_dtype,
            device,
            args.kv_cache_memory,
            args.kv_cache_blocks,
            args.kv_cache_fraction,
            max_useful_blocks=args.max_num_seqs * -(-max_model_len // args.block_size),
        )
        report_capacity(num_blocks, args.block_size, per_block, args.kv_cache_dtype)
        self.capacity_tokens = num_blocks * args.block_size
        if self.capacity_tokens < max_model_len:
            # else a long request is cut short by the cache, not by a limit anyone was told about
            print(
                f"latentkv: warning: the KV cache holds {self.capacity_tokens} tokens, fewer than max_model_len "
                f"{max_model_len}; max_model_len is capped to {self.capacity_tokens} (raise kv_cache_memory "
                "for longer sequences)",
                file=sys.stderr,
            )
            max_model_len = self.capacity_tokens
        self.bytes_per_block = per_block
        self.max_model_len = max_model_len
        self.pool = BlockPool(num_blocks, args.block_size, args.enable_prefix_caching)
        batched = args.max_num_batched_tokens or max(BATCHED_TOKENS, args.max_num_seqs)
        self.scheduler = Scheduler(KVManager(self.pool), args.max_num_seqs, batched)
        self.eos_token_ids = find_eos_token_ids(Path(args.model), self.cfg, tokenizer)
        self.runner = ModelRunner(
            model,
            args.block_size,
            num_blocks,
            args.kv_cache_dtype,
            args.attention_path,
            args.seed,
            args.nan_check,
            self.eos_token_ids,
            args.batch_invariant,
        )
        # what the engine allocated, scales included (cache/accounting.py's formula gives the same)
        self.kv_bytes_per_token = sum(c.nbytes() for c in self.runner.caches) // self.capacity_tokens
        if args.batch_invariant:
            invariant.install(model)  # pad small row counts: float32 linears, one-row bf16 ones
            self.scheduler.kv.prompt_blocks_only = True  # decode-computed blocks are not shared (kv_manager.py)
        self.requests: dict[str, list[Sequence]] = {}
        self.guides = Guides(tokenizer, self.cfg.vocab_size, self.eos_token_ids)
        self.store = open_tier(args, model.dtype, self.runner.caches, self.pool)
        self.scheduler.kv.store = self.store
        if self.store is not None:
            print(f"latentkv: {self.store.describe()}", file=sys.stderr, flush=True)
        self.pinned_blocks: list[int] = []  # template blocks held in RAM for the engine's life
        # a count the engine chose (all cores) backs off while other processes hold cores; a fixed one stays
        self.governor = ThreadGovernor(
            torch.get_num_threads(),
            args.threads is None
            and threads_from_env() is None
            and model.model.embed_tokens.weight.device.type == "cpu",
        )
        keep_freed_memory()  # the process serves now: a step's freed temporaries serve the next step
        if args.warm:
            warm_up(self, args.warm, args.warm_fraction)

    @classmethod
    def from_args(cls, args: EngineArgs) -> "LLMEngine":
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch.set_num_threads(args.threads or default_threads())  # the native kernel's OpenMP team follows it
        if device == "cpu":  # a first build of the sampler's kernel overlaps the model's load
            build_in_background(sample_kernel.EXT)
        # the engine owns this model: built for its route (batch invariance: the fixed-order linears)
        dtype = resolve_dtype(args.dtype, torch.device(device))
        if (Path(args.model) / "config.json").is_file():  # else load_model says what is missing
            args = with_folder_cache(args, ModelConfig.from_file(Path(args.model) / "config.json"), dtype)
        route = decide_route(
            device, dtype, args.attention_backend, args.quantization, args.batch_invariant, args.kv_cache_dtype
        )
        model = load_model(args.model, route=route)
        tokenizer = None if args.skip_tokenizer_init else load_tokenizer(args.tokenizer or args.model)
        engine = cls(args, model, tokenizer)
        # the engine owns this model: its weights stay as they are, so a plan may hold them
        reason = "enforce_eager" if args.enforce_eager else engine.runner.use_decode_plan()
        print(f"latentkv: {describe_route(model, reason)}", file=sys.stderr, flush=True)
        # what start-up made lives as long as the engine: out of the collector's sight, a full collection
        # stops walking the model's and tokenizer's objects (gc was ~2% of a 32-sequence decode step
        # profile on the AMX Xeon; the step ~1% faster without it; vLLM freezes its start-up heap too)
        gc.collect()
        gc.freeze()
        return engine

    # -- requests ------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> None:
        """Queue a request. Raises ValueError for an unusable prompt (empty, token ids out
        of the vocabulary, longer than max_model_len or than the whole cache)."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, ids = self.tokenize(prompt, prompt_token_ids)
        self.check_prompt(ids, params)
        seqs = [Sequence(request_id, ids, params.for_sample(i), index=i, prompt=text) for i in range(params.n)]
        if params.guided_decoding is not None:  # raises GuidedDecodingError before anything is queued
            for seq in seqs:
                seq.guide = self.guides.matcher(params.guided_decoding)
        self.requests[request_id] = seqs
        for seq in seqs:
            self.scheduler.add(seq)

    def tokenize(self, prompt, prompt_token_ids) -> tuple[str | None, list[int]]:
        if prompt_token_ids is not None:
            return (prompt if isinstance(prompt, str) else None), [int(t) for t in prompt_token_ids]
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass token ids (skip_tokenizer_init=True)")
            return prompt, self.tokenizer(prompt).input_ids
        return None, [int(t) for t in prompt]

    def check_prompt(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise PromptError("the prompt is empty")
        check_token_ids(ids, self.cfg.vocab_size)
        if len(ids) >= self.max_model_len:  # the one prompt-length rule (the server relies on it too)
            capped = (
                " (capped to what the whole KV cache holds; raise kv_cache_memory)"
                if self.max_model_len == self.capacity_tokens
                else ""
            )
            raise PromptError(
                f"the prompt has {len(ids)} tokens; max_model_len is {self.max_model_len}{capped}, "
                "so it leaves no room for output",
                code="context_length_exceeded",
            )
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer (skip_tokenizer_init=True was given)")

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its blocks; returns its final output (finish_reason "abort")."""
        seqs = self.requests.pop(request_id, None)
        if seqs is None:
            return None
        for seq in seqs:
            if not seq.is_finished:
                self.finish(seq, "abort")
        return self.make_output(seqs)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- the loop --------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        out = self.scheduler.schedule()
        if not out:
            if self.scheduler.has_unfinished():  # would loop forever: a bug, say so
                raise RuntimeError(f"scheduler made no progress: {self.stats()}")
            return []
        self.governor.before_step()
        results = run_isolated(self.runner, out)
        self.governor.after_step()
        self.scheduler.mark_computed(
            SchedulerOutput(scheduled=[s for s, r in zip(out.scheduled, results) if not isinstance(r, str)])
        )
        touched: dict[str, None] = {}
        for s, r in zip(out.scheduled, results):
            seq = s.seq
            if isinstance(r, str):  # it failed even when run alone
                touched[seq.request_id] = None
                self.fail(seq, r)
                continue
            try:
                if self.process(seq, r):
                    touched[seq.request_id] = None
            except Exception as err:  # noqa: BLE001 - a bug in one sequence's bookkeeping fails it alone
                touched[seq.request_id] = None
                self.fail(seq, describe_failure(err))
        return [
            self.make_output(self.requests.pop(rid) if self.is_done(rid) else self.requests[rid])
            for rid in touched
            if rid in self.requests
        ]

    def process(self, seq: Sequence, r: SeqResult) -> bool:
        """Take one sequence's share of the step; True when it produced a token or finished."""
        if r.prompt_logprobs is not None:
            seq.prompt_logprobs.extend(self.decorate(r.prompt_logprobs))
        if r.token is None:
            return False
        if r.nonfinite:
            self.finish(seq, "error", error="NaN or Inf in the logits")
            return True
        self.append_token(seq, r.token, r.logprobs, r.chosen_logprob)
        return True

    def fail(self, seq: Sequence, error: str) -> None:
        """Finish one sequence with finish_reason "error" and free (and scrub) its blocks —
        also when its failure came half-way through `finish` (every step here is idempotent)."""
        blocks = list(seq.block_table)
        seq.finish("error", None, error)
        self.scheduler.finish(seq)
        self.scrub(blocks)

    def append_token(self, seq: Sequence, token: int, logprobs, chosen: float | None) -> None:
        seq.append_token(token)
        seq.last_token_time = time.monotonic()
        if seq.first_token_time is None:
            seq.first_token_time = seq.last_token_time
        if logprobs is not None:
            seq.logprobs.append(self.decorate([logprobs])[0])
            seq.cumulative_logprob += chosen
        params = seq.params
        may_stop = seq.num_output_tokens >= params.min_tokens
        if seq.guide is not None and token not in self.eos_token_ids and (ended := advance(seq.guide, token)):
            if ended != "stop":
                return self.finish(seq, "error", error=ended)
            if self.tokenizer is not None:  # the grammar is complete: its last token is part of the text
                detokenize_incrementally(self.tokenizer, seq, flush=True)
            return self.finish(seq, "stop", flush=False)
        if may_stop and not params.ignore_eos and token in self.eos_token_ids:
            return self.finish(seq, "stop")
        if may_stop and token in params.stop_token_ids:
            return self.finish(seq, "stop", stop_reason=token)
        if self.tokenizer is not None:
            new_chars = len(detokenize_incrementally(self.tokenizer, seq))
            if may_stop and find_stop_string(seq, new_chars):
                return self.finish(seq, "stop", stop_reason=seq.stop_reason, flush=False)
        if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
            return self.finish(seq, "length")
        if len(seq) >= self.max_model_len:  # (max_model_len <= the cache's capacity, see __init__)
            return self.finish(seq, "length")

    def finish(
        self, seq: Sequence, reason: str, stop_reason=None, error: str | None = None, flush: bool = True
    ) -> None:
        if flush and self.tokenizer is not None and reason != "error":
            # EOS / a stop token ends the text without being part of it
            stop_token = reason == "stop" and (stop_reason is None or isinstance(stop_reason, int))
            detokenize_incrementally(self.tokenizer, seq, flush=True, end=len(seq) - 1 if stop_token else None)
        blocks = list(seq.block_table)
        seq.finish(reason, stop_reason, error)
        self.scheduler.finish(seq)
        if reason == "error":
            self.scrub(blocks)

    def scrub(self, blocks: list[int]) -> None:
        """A NaN sequence's blocks may hold NaN latents: zero the ones nobody else uses and
        forget their prefix hashes so no one hits them later."""
        idle = [b for b in blocks if self.pool.blocks[b].ref_count == 0]
        for b in idle:
            self.pool.evict(b)
        self.runner.scrub_blocks(idle)

    def is_done(self, request_id: str) -> bool:
        return all(s.is_finished for s in self.requests[request_id])

    def decorate(self, position_logprobs: list):
        """Fill in each Logprob's decoded token text."""
        if self.tokenizer is not None:
            for d in position_logprobs:
                for token_id, lp in (d or {}).items():
                    lp.decoded_token = self.tokenizer.decode([token_id])
        return position_logprobs

    def make_output(self, seqs: list[Sequence]) -> RequestOutput:
        first = seqs[0]
        completions = [
            CompletionOutput(
                index=s.index,
                text=visible_text(s),
                token_ids=list(s.output_token_ids),
                cumulative_logprob=s.cumulative_logprob if s.logprobs is not None else None,
                logprobs=list(s.logprobs) if s.logprobs is not None else None,
                finish_reason=s.finish_reason,
                stop_reason=s.stop_reason,
            )
            for s in seqs
        ]
        errors = [s.error for s in seqs if s.error]
        return RequestOutput(
            request_id=first.request_id,
            prompt=first.prompt,
            prompt_token_ids=first.prompt_token_ids,
            outputs=completions,
            finished=all(s.is_finished for s in seqs),
            prompt_logprobs=list(first.prompt_logprobs) if first.prompt_logprobs is not None else None,
            num_cached_tokens=first.num_cached_tokens,
            error=errors[0] if errors else None,
            metrics={
                "arrival_time": first.arrival_time,
                "first_token_time": first.first_token_time,
                "last_token_time": max((s.last_token_time or 0.0) for s in seqs) or None,
            },
        )

    def stats(self) -> dict:
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "blocks_used": self.pool.num_used,
            "blocks_free": self.pool.num_free,
            "num_blocks": self.pool.num_blocks,
            "prefix_queries": self.pool.prefix_queries,
            "prefix_hits": self.pool.prefix_hits,
            "preemptions": self.scheduler.num_preemptions,
            "capacity_tokens": self.capacity_tokens,
            "pinned_blocks": len(self.pinned_blocks),
            **({f"store_{k}": v for k, v in vars(self.store.counters).items()} if self.store is not None else {}),
        }

    def close(self, timeout: float = 30.0):
        """Write out the store's pending blocks (within `timeout` seconds; the rest are dropped)
        and stop its writer; the engine stays usable without the store. -> the store's
        FlushReport (blocks written, dropped), or None without a store (or when closed already)."""
        if self.store is None:
            return None
        store, self.scheduler.kv.store, self.store = self.store, None, None
        return store.close(timeout)
