"""What completions and chat share: submitting requests, following their outputs into
per-choice deltas, usage, logprobs, server-sent events."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

from fastapi.responses import StreamingResponse

from latentkv.server.async_engine import AsyncEngine, EngineDeadError, EngineStepError, Submission
from latentkv.server.errors import ApiError, bad_request, internal_error_body
from latentkv.server.metrics import ServerMetrics
from latentkv.server.shutdown import Drain
from latentkv.settings import DEFAULT_MAX_REQUEST_BYTES


@dataclass
class ServerState:
    """Everything the route handlers need."""

    engine: AsyncEngine
    metrics: ServerMetrics
    served_model_name: str
    max_model_len: int
    max_num_seqs: int
    max_waiting_requests: int
    vocab_size: int  # token ids of prompts must be below it
    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    metrics_public: bool = False  # /metrics without the key
    drain: Drain = field(default_factory=Drain)  # graceful shutdown (server/shutdown.py)
    created: int = field(default_factory=lambda: int(time.time()))

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise ApiError(
                404,
                f"the model {model!r} does not exist; this server serves {self.served_model_name!r}",
                param="model",
                code="model_not_found",
            )

    def check_queue(self, num_seqs: int) -> None:
        """503 + Retry-After when taking `num_seqs` more would overfill the waiting queue."""
        waiting = self.engine.waiting_after(num_seqs)
        if waiting > self.max_waiting_requests:
            raise ApiError(
                503,
                f"the server is busy: {waiting} sequences would wait, more than the limit of "
                f"{self.max_waiting_requests}; retry later",
                headers={"Retry-After": "1"},
                code="overloaded",
            )

    async def submit(self, request_id: str, prepare, params, param: str) -> Submission:
        try:
            return await self.engine.add(request_id, prepare, params)
        except EngineDeadError as err:
            raise unavailable(err) from None
        except ValueError as err:  # a PromptError, the engine's own check, or a GuidedDecodingError
            raise bad_request(
                str(err), param=getattr(err, "param", None) or param, code=getattr(err, "code", "invalid_prompt")
            ) from None


def unavailable(err: EngineDeadError) -> ApiError:
    """503 in OpenAI's format: the engine stopped, or the server shuts down (then with Retry-After:
    another replica, or this one restarted, will answer)."""
    code = getattr(err, "code", "engine_unavailable")
    return ApiError(503, str(err), code=code, headers={"Retry-After": "1"} if code != "engine_unavailable" else None)


class EngineStream(StreamingResponse):
    """A streamed answer that aborts its engine requests however the response ends: a client gone
    before the body started (its generator then never runs, so no `finally` of it would), cut
    mid-answer, or an error. Aborting a finished request is a no-op."""

    def __init__(self, content, state: "ServerState", subs: list[Submission]):
        super().__init__(content, media_type="text/event-stream")
        self.engine, self.subs = state.engine, subs

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            for sub in self.subs:
                if sub.request_id in self.engine.streams:  # (a finished request has left it)
                    self.engine.abort(sub.request_id)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def submit_all(state: ServerState, base_id: str, prepares: list, params, param: str) -> list[Submission]:
    """Submit one engine request per prompt; if one is refused, abort those already taken."""
    subs: list[Submission] = []
    try:
        for i, prepare in enumerate(prepares):
            subs.append(await state.submit(f"{base_id}-{i}", prepare, params, param))
    except BaseException:
        for sub in subs:
            state.engine.abort(sub.request_id)
        raise
    return subs


async def follow(state: ServerState, subs: list[Submission]):
    """Yield (prompt index, cumulative RequestOutput) from all submissions as they come,
    timing first tokens and the gaps between outputs. Closing it aborts what still runs."""
    merged: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, sub: Submission):
        try:
            async for out in state.engine.generate(sub):
                await merged.put((i, out))
        except Exception as err:  # noqa: BLE001 - handed to the consumer
            await merged.put((i, err))
        finally:
            await merged.put((i, done))

    tasks = [asyncio.create_task(pump(i, sub)) for i, sub in enumerate(subs)]
    last: dict[int, float] = {}
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await merged.get()
            if item is done:
                remaining -= 1
                continue
            if isinstance(item, BaseException):
                if isinstance(item, EngineDeadError):
                    raise unavailable(item)
                raise ApiError(500, str(item), code="generation_error") if isinstance(item, EngineStepError) else item
            now = time.perf_counter()
            if any(c.token_ids for c in item.outputs):
                if i in last:
                    state.metrics.itl.observe(now - last[i])
                else:
                    state.metrics.ttft.observe(now - subs[i].arrived)
                last[i] = now
            yield i, item
    finally:
        for task in tasks:
            task.cancel()


async def collect(state: ServerState, subs: list[Submission]) -> list:
    """The final output of every submission (in prompt order); a failed one is a 500."""
    finals: list = [None] * len(subs)
    async for i, out in follow(state, subs):
        raise_if_failed(out)
        if out.finished:
            finals[i] = out
    return finals


def raise_if_failed(out) -> None:
    if out.error:
        raise ApiError(500, f"request failed: {out.error}", code="generation_error")


@dataclass
class Delta:
    """What one choice gained since the last event."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list | None
    finish_reason: str | None
    first: bool


class DeltaTracker:
    """Turns cumulative outputs into per-choice deltas (choice index = prompt · n + sample)."""

    def __init__(self, n: int):
        self.n = n
        self.chars: dict[int, int] = {}
        self.tokens: dict[int, int] = {}
        self.finished: set[int] = set()

    def update(self, prompt_index: int, out) -> list[Delta]:
        deltas = []
        for c in out.outputs:
            index = prompt_index * self.n + c.index
            if index in self.finished:
                continue
            first = index not in self.chars
            chars, tokens = self.chars.get(index, 0), self.tokens.get(index, 0)
            text, new_ids = c.text[chars:], c.token_ids[tokens:]
            logprobs = c.logprobs[tokens : len(c.token_ids)] if c.logprobs is not None else None
            self.chars[index], self.tokens[index] = len(c.text), len(c.token_ids)
            if c.finish_reason is not None:
                self.finished.add(index)
            if text or c.finish_reason is not None or first:
                deltas.append(Delta(index, text, new_ids, logprobs, c.finish_reason, first))
        return deltas


def usage(finals: list) -> dict:
    """OpenAI's usage, with the prompt tokens served from the prefix cache or the KV store (not computed)
    as prompt_tokens_details.cached_tokens."""
    prompt = sum(len(out.prompt_token_ids) for out in finals)
    completion = sum(len(c.token_ids) for out in finals for c in out.outputs)
    cached = sum(out.num_cached_tokens for out in finals)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def top_entries(position: dict, k: int) -> list:
    """The top-k (by rank) Logprob entries of one position, as (token id, Logprob)."""
    return sorted(((tid, lp) for tid, lp in position.items() if lp.rank <= k), key=lambda e: e[1].rank)


def token_text(lp, fallback: str = "") -> str:
    return lp.decoded_token if lp.decoded_token is not None else fallback


def completion_logprobs(token_ids: list[int], positions: list, k: int, offset: int, result: dict | None = None) -> dict:
    """OpenAI's legacy completions logprobs: tokens, token_logprobs, top_logprobs, text_offset.
    Each position's top_logprobs holds its k most likely tokens and, as with OpenAI, always the
    token itself (k = 0: only it). A position without logprobs (the prompt's first token) is
    null. Appends to `result` when given (the prompt's logprobs, then the completion's)."""
    result = result or {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tid, position in zip(token_ids, positions):
        chosen = position[tid] if position else None
        token = token_text(chosen) if chosen is not None else None
        result["tokens"].append(token)
        result["token_logprobs"].append(chosen.logprob if chosen is not None else None)
        top = None
        if chosen is not None:
            top = {token_text(lp): lp.logprob for _, lp in top_entries(position, k)}
            top[token] = chosen.logprob
        result["top_logprobs"].append(top)
        result["text_offset"].append(offset)
        offset += len(token or "")
    return result


def prompt_logprobs_body(out, k: int) -> dict:
    """The prompt's part of an echoed completion's logprobs (its first token's are null). The
    first token's text comes from the tokenizer's decoding, which the engine did not run for it."""
    ids = list(out.prompt_token_ids)
    positions = list(out.prompt_logprobs or [None] * len(ids))
    body = completion_logprobs(ids, positions, k, 0)
    prompt = out.prompt or ""
    rest = sum(len(t or "") for t in body["tokens"][1:])
    first = prompt[: len(prompt) - rest] if rest <= len(prompt) else ""
    body["tokens"][0] = first
    body["text_offset"] = [0] + [o + len(first) for o in body["text_offset"][1:]]
    return body


def chat_logprobs(token_ids: list[int], positions: list, k: int) -> dict:
    """OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    content = []
    for tid, position in zip(token_ids, positions):
        chosen = position[tid]
        token = token_text(chosen)
        content.append(
            {
                "token": token,
                "logprob": chosen.logprob,
                "bytes": list(token.encode()),
                "top_logprobs": [
                    {"token": token_text(lp), "logprob": lp.logprob, "bytes": list(token_text(lp).encode())}
                    for _, lp in top_entries(position, k)
                ],
            }
        )
    return {"content": content, "refusal": None}


def chunk_writer(object_name: str, request_id: str, model: str, include_usage: bool):
    """-> chunk(choices, usage=None): one SSE event of a streamed response (shared by
    chat and completions; only the object name differs). With include_usage, chat chunks
    carry "usage": null until the last (the spec's chunk allows null); a completions chunk
    has the non-streamed shape, whose usage may be absent but not null, so it is left out."""
    created = int(time.time())

    def chunk(choices: list, usage_value=None) -> str:
        body = {"id": request_id, "object": object_name, "created": created, "model": model, "choices": choices}
        if include_usage and (usage_value is not None or object_name != "text_completion"):
            body["usage"] = usage_value
        return sse(body)

    return chunk


# characters JSON leaves raw that Python's str.splitlines (httpx's aiter_lines) takes for line ends: a
# token holding one would cut its event in two for those clients, so they go out as \u escapes
LINE_BREAKERS = str.maketrans({c: f"\\u{ord(c):04x}" for c in "\x85\u2028\u2029"})


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False).translate(LINE_BREAKERS)
    return f"data: {data}\n\n"


def sse_error(err: Exception) -> str:
    if isinstance(err, ApiError):
        return sse(err.body() | {"status": err.status})
    return sse(internal_error_body(err) | {"status": 500})
