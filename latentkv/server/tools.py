"""Tool calls for /v1/chat/completions, through guided decoding.

- `tool_choice: "required"`: the output is guided to a JSON array of one or more
  `{"name": <a tool's name>, "arguments": <that tool's parameters schema>}` (exactly one
  with `parallel_tool_calls: false`), so every call names a real tool and its arguments
  are valid JSON for its schema.
- a named function: the output is guided to that function's parameters schema and is the
  call's `arguments`.
- `"auto"` (the default with tools): with a chat template that defines a tool format (it
  reads `tools`), the tools are rendered into the prompt and an answer in the Hermes / Qwen
  form `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` becomes `tool_calls`; such an
  answer is held until it ends (only then is it known to be a call). Nothing is guided. With a
  template that has no tool format (the bundled SmolLM2's) "auto" is "none": the model answers
  in text, streamed as usual.
- `"none"`, or no tools: text, as without tools.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from latentkv.guided import GuidedDecodingParams
from latentkv.server.errors import bad_request
from latentkv.server.protocol import ChatCompletionRequest

HERMES_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass
class ToolPlan:
    mode: str  # "required" | "named" | "auto"
    guided: GuidedDecodingParams | None  # the grammar of the output (not for "auto")
    function: str | None = None  # the named function
    tools: list[dict] | None = None  # for the chat template


def parameters(function) -> dict:
    return function.parameters if function.parameters is not None else NO_ARGUMENTS


def plan_tools(req: ChatCompletionRequest, chat_template: str | None) -> ToolPlan | None:
    """How this request calls tools (None: it answers in text); 400 for a choice that names
    no given tool."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", param="tool_choice")
        return None
    if choice == "none":
        return None
    template_tools = [tool.model_dump(exclude_none=True) for tool in req.tools]
    if choice is None or choice == "auto":
        if not defines_tool_format(chat_template):
            return None
        return ToolPlan("auto", None, tools=template_tools)
    if choice == "required":
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": t.function.name}, "arguments": parameters(t.function)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in req.tools
        ]
        schema = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if req.parallel_tool_calls is False:
            schema["maxItems"] = 1
        return ToolPlan("required", GuidedDecodingParams(json=schema, param="tools"), tools=template_tools)
    named = [t for t in req.tools if t.function.name == choice.function.name]
    if not named:
        raise bad_request(
            f"tool_choice names the function {choice.function.name!r}, which is not among the tools",
            param="tool_choice",
        )
    return ToolPlan(
        "named",
        GuidedDecodingParams(json=parameters(named[0].function), param="tools"),
        function=choice.function.name,
        tools=template_tools,
    )


def defines_tool_format(chat_template: str | None) -> bool:
    """Does this (Jinja) chat template render the `tools` it is given?"""
    return bool(chat_template) and re.search(r"\btools\b", str(chat_template)) is not None


def call(name: str, arguments) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": text}}


def parse_tool_calls(plan: ToolPlan, text: str) -> list[dict] | None:
    """The answer's tool calls, or None when it holds none (a cut-off answer stays text)."""
    try:
        if plan.mode == "named":
            json.loads(text)
            return [call(plan.function, text)]
        if plan.mode == "required":
            return [call(c["name"], c["arguments"]) for c in json.loads(text)]
    except (ValueError, KeyError, TypeError):
        return None
    calls = []
    for found in HERMES_CALL.finditer(text):
        try:
            body = json.loads(found.group(1))
            calls.append(call(body["name"], body.get("arguments", body.get("parameters", {}))))
        except (ValueError, KeyError, TypeError):
            continue
    return calls or None


def strip_tool_calls(text: str) -> str:
    """The text of an "auto" answer around its tool calls."""
    return HERMES_CALL.sub("", text).strip()
