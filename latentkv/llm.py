"""`LLM`: offline batched generation, vLLM's facade (`from latentkv import LLM, SamplingParams`)."""

from __future__ import annotations

import itertools
from dataclasses import fields

from tqdm.auto import tqdm

from latentkv.engine.args import EngineArgs
from latentkv.engine.chat_template import render_chat
from latentkv.engine.engine import LLMEngine
from latentkv.engine.outputs import CompletionOutput, Logprob, RequestOutput
from latentkv.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]

PromptType = str | list[int] | dict


class LLM:
    """LLM(model=folder, dtype="auto",
    kv_cache_dtype="auto"|"int8"|"fp8_e4m3"|"int8_rope8"|"fp8_e4m3_rope8"|"q4_0"|"bfloat16"|"float32", block_size=16,
    kv_cache_memory=None|bytes|"2GiB", max_model_len=None, max_num_seqs=64,
    max_num_batched_tokens=None, enable_prefix_caching=True, seed=0, skip_tokenizer_init=False, ...)
    — every `EngineArgs` field is accepted as a keyword."""

    def __init__(self, model: str, **kwargs):
        known = {f.name for f in fields(EngineArgs)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"LLM() got unknown option(s) {unknown}; known: {sorted(known - {'model'})}")
        self.llm_engine = LLMEngine.from_args(EngineArgs(model=str(model), **kwargs))
        self.request_counter = itertools.count()

    def close(self, timeout: float = 30.0):
        """Write the KV store's queued blocks to disk (within `timeout` seconds) and stop its
        writer; -> its FlushReport (blocks written, dropped), or None without a store. The LLM
        still generates afterwards, without the store. `with LLM(...) as llm:` closes on exit."""
        return self.llm_engine.close(timeout)

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def engine(self) -> LLMEngine:
        """`llm_engine` (vLLM's name) under a shorter one."""
        return self.llm_engine

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: PromptType | list[PromptType],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for each prompt (a string, a list of token ids, or {"prompt_token_ids": [...]}
        or {"prompt": "..."}); outputs come back in prompt order. A prompt the engine cannot
        take (too long, empty, ...) gets an output with finish_reason "error" and `.error`
        set; the others still run."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = (
            sampling_params
            if isinstance(sampling_params, list)
            else [sampling_params or SamplingParams()] * len(prompts)
        )
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        order: dict[str, int] = {}
        results: list[RequestOutput | None] = [None] * len(prompts)
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            rid = str(next(self.request_counter))
            text, ids = split_prompt(prompt)
            try:
                self.llm_engine.add_request(rid, text, p, prompt_token_ids=ids)
                order[rid] = i
            except ValueError as err:
                results[i] = rejected_output(rid, text, ids, p, str(err))
        self.run_engine(order, results, use_tqdm)
        return results

    def run_engine(self, order: dict[str, int], results: list, use_tqdm: bool) -> None:
        bar = None
        if use_tqdm and order:
            bar = tqdm(total=len(order), desc="generating", unit="req")
        try:
            while self.llm_engine.has_unfinished_requests():
                for out in self.llm_engine.step():
                    if out.finished and out.request_id in order:
                        results[order[out.request_id]] = out
                        if bar:
                            bar.update(1)
        finally:
            if bar:
                bar.close()

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {"role", "content"} messages) or a
        list of them, formatted by the tokenizer's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = []
        for conversation in conversations:
            text, ids = render_chat(self.llm_engine.tokenizer, conversation, add_generation_prompt, chat_template)
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm)


def split_prompt(prompt: PromptType) -> tuple[str | None, list[int] | None]:
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, dict):
        if "prompt_token_ids" not in prompt and "prompt" not in prompt:
            raise ValueError("a dict prompt needs 'prompt_token_ids' or 'prompt'")
        ids = prompt.get("prompt_token_ids")
        return prompt.get("prompt"), (list(ids) if ids is not None else None)
    return None, list(prompt)


def rejected_output(request_id: str, text, ids, params: SamplingParams, error: str) -> RequestOutput:
    outputs = [CompletionOutput(index=i, text="", token_ids=[], finish_reason="error") for i in range(params.n)]
    return RequestOutput(
        request_id=request_id,
        prompt=text,
        prompt_token_ids=list(ids or []),
        outputs=outputs,
        finished=True,
        error=error,
    )
