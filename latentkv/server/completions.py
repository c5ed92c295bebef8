"""POST /v1/completions: one engine request per prompt, `n` samples each."""

from __future__ import annotations

import time

from fastapi.responses import JSONResponse, StreamingResponse

from latentkv.engine.prompt_errors import PromptError, check_token_ids
from latentkv.guided import GuidedDecodingError
from latentkv.server.errors import bad_request
from latentkv.server.protocol import CompletionRequest, sampling_param_named
from latentkv.server.serving import (
    DeltaTracker,
    EngineStream,
    ServerState,
    chunk_writer,
    collect,
    completion_logprobs,
    follow,
    new_id,
    prompt_logprobs_body,
    raise_if_failed,
    sse,
    sse_error,
    submit_all,
    usage,
)


# Each prompt becomes prepare(tokenizer) -> (text, ids), run in the tokenizer thread; the
# engine checks the prompt (empty, vocabulary, length) when it adds the request.
def text_prompt(prompt: str):
    def prepare(tokenizer):
        if tokenizer is None:
            raise PromptError("this server has no tokenizer; send the prompt as token ids")
        return prompt, tokenizer(prompt).input_ids

    return prepare


def token_prompt(ids: list[int], vocab_size: int):
    def prepare(tokenizer):
        check_token_ids(ids, vocab_size)  # before decoding them (the engine checks the rest)
        text = tokenizer.decode(ids) if tokenizer is not None else None
        return text, list(ids)

    return prepare


def check_request(req: CompletionRequest) -> list:
    prompts = req.prompts()
    if not prompts:
        raise bad_request("the prompt is empty", param="prompt", code="invalid_prompt")
    for p in prompts:
        if (isinstance(p, str) and not p) or (isinstance(p, list) and not p):
            raise bad_request("the prompt is empty", param="prompt", code="invalid_prompt")
    if req.suffix:
        raise bad_request("suffix is not supported", param="suffix", code="unsupported_parameter")
    return prompts


async def create_completion(req: CompletionRequest, state: ServerState):
    state.check_model(req.model)
    prompts = check_request(req)
    scoring = req.echo and req.logprobs is not None  # the prompt's own logprobs too (lm-eval's loglikelihood)
    try:
        guided = req.guided()
    except GuidedDecodingError as err:
        raise bad_request(str(err), param=err.param, code=err.code) from None
    try:
        # max_tokens 0 still picks one token (in the prefill step, no extra forward); it is not returned
        params = req.sampling_params(
            1 if req.max_tokens == 0 else req.max_tokens,
            req.logprobs,
            guided,
            prompt_logprobs=req.logprobs if scoring else None,
        )
    except ValueError as err:
        raise bad_request(str(err), param=sampling_param_named(err)) from None
    state.check_queue(len(prompts) * req.n)
    prepares = [text_prompt(p) if isinstance(p, str) else token_prompt(p, state.vocab_size) for p in prompts]
    request_id = new_id("cmpl")
    subs = await submit_all(state, request_id, prepares, params, "prompt")
    if req.stream and req.max_tokens != 0:
        return EngineStream(stream_completion(req, state, subs, request_id), state, subs)
    finals = await collect(state, subs)
    body = completion_body(req, state, finals, request_id)
    if req.stream:  # max_tokens 0: nothing to stream but the prompt; one chunk
        chunk = chunk_writer("text_completion", request_id, state.served_model_name, req.include_usage)
        events = [chunk(body["choices"])] + ([chunk([], body["usage"])] if req.include_usage else []) + [sse("[DONE]")]
        return StreamingResponse(iter(events), media_type="text/event-stream")
    return JSONResponse(body)


def choice_logprobs(req: CompletionRequest, out, c, prefix: str) -> dict | None:
    """The choice's logprobs: with echo the prompt's first, then the completion's."""
    if req.logprobs is None or c.logprobs is None:
        return None
    body = prompt_logprobs_body(out, req.logprobs) if req.echo else None
    if req.max_tokens == 0:
        return body
    return completion_logprobs(c.token_ids, c.logprobs, req.logprobs, len(prefix), body)


def completion_body(req: CompletionRequest, state: ServerState, finals: list, request_id: str) -> dict:
    choices = []
    for i, out in enumerate(finals):
        prefix = (out.prompt or "") if req.echo else ""
        for c in out.outputs:
            scored_only = req.max_tokens == 0
            choices.append(
                {
                    "index": i * req.n + c.index,
                    "text": prefix + ("" if scored_only else c.text),
                    "logprobs": choice_logprobs(req, out, c, prefix),
                    "finish_reason": "length" if scored_only else c.finish_reason,
                    "stop_reason": None if scored_only else c.stop_reason,
                }
            )
    choices.sort(key=lambda ch: ch["index"])
    counts = usage(finals)
    if req.max_tokens == 0:
        counts = {**counts, "completion_tokens": 0, "total_tokens": counts["prompt_tokens"]}
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.served_model_name,
        "choices": choices,
        "usage": counts,
    }


async def stream_completion(req: CompletionRequest, state: ServerState, subs: list, request_id: str):
    chunk = chunk_writer("text_completion", request_id, state.served_model_name, req.include_usage)
    tracker = DeltaTracker(req.n)
    offsets: dict[int, int] = {}
    finals: dict[int, object] = {}

    try:
        async for i, out in follow(state, subs):
            raise_if_failed(out)
            if out.finished:
                finals[i] = out
            for d in tracker.update(i, out):
                text = ((out.prompt or "") if req.echo and d.first else "") + d.text
                logprobs = None
                if req.logprobs is not None and d.logprobs is not None:
                    echoed = prompt_logprobs_body(out, req.logprobs) if req.echo and d.first else None
                    start = len(out.prompt or "") if echoed is not None else offsets.get(d.index, 0)
                    logprobs = completion_logprobs(d.token_ids, d.logprobs, req.logprobs, start, echoed)
                offsets[d.index] = offsets.get(d.index, 0) + len(text)
                if text or d.finish_reason:
                    yield chunk(
                        [{"index": d.index, "text": text, "logprobs": logprobs, "finish_reason": d.finish_reason}]
                    )
        if req.include_usage:
            yield chunk([], usage([finals[i] for i in sorted(finals)]))
    except Exception as err:  # noqa: BLE001 - headers are sent; report in the stream
        yield sse_error(err)
    yield sse("[DONE]")
