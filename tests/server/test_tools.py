"""Tool plans and answer parsing (latentkv/server/tools.py) without a server: which grammar a
tool_choice gets, "auto" only with a template that renders tools, Hermes-style calls parsed."""

from __future__ import annotations

import json

import pytest
from tiny_lm import build_tokenizer

from latentkv.engine.chat_template import render_chat
from latentkv.server.errors import ApiError
from latentkv.server.protocol import ChatCompletionRequest
from latentkv.server.tools import defines_tool_format, parse_tool_calls, plan_tools

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
    {"type": "function", "function": {"name": "now"}},
]
HERMES = (
    "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
)


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "1+2?"}], tools=TOOLS, **fields)


def test_required_named_none_and_auto_plans():
    required = plan_tools(request(tool_choice="required"), None)
    schema = required.guided.json
    assert required.mode == "required" and schema["minItems"] == 1 and "maxItems" not in schema
    assert [item["properties"]["name"]["const"] for item in schema["items"]["anyOf"]] == ["add", "now"]
    assert plan_tools(request(tool_choice="required", parallel_tool_calls=False), None).guided.json["maxItems"] == 1
    named = plan_tools(request(tool_choice={"type": "function", "function": {"name": "add"}}), None)
    assert named.mode == "named" and named.guided.json == TOOLS[0]["function"]["parameters"]
    assert plan_tools(request(tool_choice="none"), HERMES) is None
    assert plan_tools(request(), "{{ messages }}") is None  # auto, no tool format: text
    auto = plan_tools(request(tool_choice="auto"), HERMES)
    assert auto.mode == "auto" and auto.guided is None and auto.tools[0]["function"]["name"] == "add"
    with pytest.raises(ApiError):
        plan_tools(request(tool_choice={"type": "function", "function": {"name": "sub"}}), None)
    assert defines_tool_format(HERMES) and not defines_tool_format(None) and not defines_tool_format("toolset")


def test_parsing_answers():
    required = plan_tools(request(tool_choice="required"), None)
    calls = parse_tool_calls(
        required, '[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]'
    )
    assert [c["function"]["name"] for c in calls] == ["add", "now"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert parse_tool_calls(required, '[{"name": "add", "argu') is None  # cut off by max_tokens: text
    named = plan_tools(request(tool_choice={"type": "function", "function": {"name": "add"}}), None)
    assert parse_tool_calls(named, '{"a": 1, "b": 2}')[0]["function"]["arguments"] == '{"a": 1, "b": 2}'
    auto = plan_tools(request(), HERMES)
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    [call] = parse_tool_calls(auto, text)
    assert call["function"]["name"] == "add" and call["id"].startswith("call_")
    assert parse_tool_calls(auto, "It is 3.") is None


def test_tools_reach_a_template_that_renders_them():
    tok = build_tokenizer()
    text, ids = render_chat(tok, [{"role": "user", "content": "1+2?"}], chat_template=HERMES, tools=TOOLS)
    assert text.startswith("<tools>") and '"add"' in text and ids
    plain, _ = render_chat(tok, [{"role": "user", "content": "1+2?"}], tools=TOOLS)  # the tiny template ignores them
    assert "add" not in plain
