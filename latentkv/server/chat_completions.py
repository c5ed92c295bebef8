"""POST /v1/chat/completions: the conversation through the model's chat template; output
guided by response_format / guided_* or by tools (server/tools.py)."""

from __future__ import annotations

import time

from fastapi.responses import JSONResponse

from latentkv.engine.chat_template import render_chat
from latentkv.guided import GuidedDecodingError
from latentkv.server.errors import bad_request
from latentkv.server.protocol import ChatCompletionRequest, sampling_param_named
from latentkv.server.serving import (
    DeltaTracker,
    EngineStream,
    ServerState,
    chunk_writer,
    chat_logprobs,
    collect,
    follow,
    new_id,
    raise_if_failed,
    sse,
    sse_error,
    submit_all,
    usage,
)
from latentkv.server.tools import ToolPlan, parse_tool_calls, plan_tools, strip_tool_calls


def chat_prompt(conversation: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None):
    """-> prepare(tokenizer): run in the tokenizer thread; the engine checks the prompt's length."""
    return lambda tokenizer: render_chat(tokenizer, conversation, add_generation_prompt, tools=tools)


async def create_chat_completion(req: ChatCompletionRequest, state: ServerState):
    state.check_model(req.model)
    conversation = req.conversation()
    if not any(m["content"] or m.get("tool_calls") for m in conversation):
        raise bad_request("the messages are empty", param="messages", code="invalid_prompt")
    plan = plan_tools(req, getattr(state.engine.tokenizer, "chat_template", None))
    try:
        # a forced tool call's grammar takes the place of response_format
        guided = plan.guided if plan is not None and plan.guided is not None else req.guided()
    except GuidedDecodingError as err:
        raise bad_request(str(err), param=err.param, code=err.code) from None
    try:
        params = req.sampling_params(req.token_limit(), req.num_logprobs(), guided)
    except ValueError as err:
        raise bad_request(str(err), param=sampling_param_named(err)) from None
    state.check_queue(req.n)
    request_id = new_id("chatcmpl")
    prepare = chat_prompt(conversation, req.add_generation_prompt, plan.tools if plan is not None else None)
    subs = await submit_all(state, request_id, [prepare], params, "messages")
    if req.stream:
        return EngineStream(stream_chat(req, state, subs, request_id, plan), state, subs)
    finals = await collect(state, subs)
    return JSONResponse(chat_body(req, state, finals[0], request_id, plan))


def answer(plan: ToolPlan | None, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
    """-> (the message's content / tool_calls fields, finish_reason)."""
    calls = parse_tool_calls(plan, text) if plan is not None else None
    if not calls:
        return {"content": text}, finish_reason
    rest = strip_tool_calls(text) if plan.mode == "auto" else ""
    return {"content": rest or None, "tool_calls": calls}, "tool_calls"


def chat_body(req: ChatCompletionRequest, state: ServerState, final, request_id: str, plan: ToolPlan | None) -> dict:
    choices = []
    for c in final.outputs:
        logprobs = (
            chat_logprobs(c.token_ids, c.logprobs, req.top_logprobs or 0)
            if req.logprobs and c.logprobs is not None
            else None
        )
        fields, finish_reason = answer(plan, c.text, c.finish_reason)
        choices.append(
            {
                "index": c.index,
                "message": {"role": "assistant", "refusal": None, **fields},
                "logprobs": logprobs,
                "finish_reason": finish_reason,
                "stop_reason": c.stop_reason,
            }
        )
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": state.served_model_name,
        "choices": choices,
        "usage": usage([final]),
    }


async def stream_chat(
    req: ChatCompletionRequest, state: ServerState, subs: list, request_id: str, plan: ToolPlan | None
):
    """Text streams as it comes; with tools the answer is held until it ends, since only
    then is it known to be a tool call (and its arguments complete)."""
    chunk = chunk_writer("chat.completion.chunk", request_id, state.served_model_name, req.include_usage)
    tracker = DeltaTracker(req.n)
    final = None
    held: dict[int, str] = {}

    try:
        async for _, out in follow(state, subs):
            raise_if_failed(out)
            if out.finished:
                final = out
            for d in tracker.update(0, out):
                if d.first:
                    yield chunk(
                        [
                            {
                                "index": d.index,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ]
                    )
                if plan is not None:
                    held[d.index] = held.get(d.index, "") + d.text
                    if d.finish_reason:
                        yield chunk([tool_delta(d.index, plan, held[d.index], d.finish_reason)])
                    continue
                logprobs = None
                if req.logprobs and d.logprobs is not None:
                    logprobs = chat_logprobs(d.token_ids, d.logprobs, req.top_logprobs or 0)
                if d.text or logprobs:
                    yield chunk(
                        [{"index": d.index, "delta": {"content": d.text}, "logprobs": logprobs, "finish_reason": None}]
                    )
                if d.finish_reason:
                    yield chunk([{"index": d.index, "delta": {}, "logprobs": None, "finish_reason": d.finish_reason}])
        if req.include_usage and final is not None:
            yield chunk([], usage([final]))
    except Exception as err:  # noqa: BLE001 - headers are sent; report in the stream
        yield sse_error(err)
    yield sse("[DONE]")


def tool_delta(index: int, plan: ToolPlan, text: str, finish_reason: str) -> dict:
    """A held answer's one chunk: its tool calls (each with its index) or its text."""
    fields, finish_reason = answer(plan, text, finish_reason)
    delta = {"content": fields["content"]}
    if "tool_calls" in fields:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(fields["tool_calls"])]
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
