"""Structured outputs and tool calls through the server on the tiny random model: whatever
the model would say, the answer parses and validates; bad grammars are 400s naming the field."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from server_helpers import MODEL_NAME
from spec import check, events, post

jsonschema = pytest.importorskip("jsonschema")

# bounded everywhere, so even a random model closes the object within max_tokens
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog"]},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "pet", "ok"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "weather in a city", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {"name": "ping", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
    },
]
SCHEMAS = {"get_weather": WEATHER, "ping": TOOLS[1]["function"]["parameters"]}
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "who is there?"}], "max_tokens": 120}


def chat(server, **fields) -> dict:
    r = post(server, "/chat/completions", {**CHAT, **fields})
    assert r.status_code == 200, r.text
    check(r.json(), "CreateChatCompletionResponse")
    return r.json()


def test_json_schema_response_format_always_parses_and_validates(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    body = chat(server, response_format=fmt, n=4, temperature=1.0, seed=11)
    for choice in body["choices"]:
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)


def test_json_schema_on_completions_and_streamed(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    r = post(
        server,
        "/completions",
        {
            "model": MODEL_NAME,
            "prompt": "a person:",
            "max_tokens": 120,
            "response_format": fmt,
            "temperature": 0.8,
            "seed": 1,
        },
    ).json()
    jsonschema.validate(json.loads(r["choices"][0]["text"]), PERSON)
    chunks = events(server, "/chat/completions", {**CHAT, "response_format": fmt, "temperature": 0.8, "seed": 2})
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_regex_and_choice(server):
    body = chat(server, response_format={"type": "json_object"}, temperature=0)
    choice = body["choices"][0]
    if choice["finish_reason"] == "stop":  # a free-form object may run past max_tokens on a random model
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:
        assert choice["message"]["content"].startswith("{")
    regex = chat(server, guided_regex=r"[0-9]{3}-[a-z]{2}", temperature=1.0, seed=4)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", regex["choices"][0]["message"]["content"])
    picked = chat(server, guided_choice=["red", "green", "blue"], n=3, temperature=1.0, seed=5)
    assert {c["message"]["content"] for c in picked["choices"]} <= {"red", "green", "blue"}


@pytest.mark.parametrize(
    "field,value,param",
    [
        (
            "response_format",
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
            "response_format.json_schema.schema",
        ),
        (
            "response_format",
            {"type": "json_schema", "json_schema": {"name": "x"}},
            "response_format.json_schema.schema",
        ),
        ("guided_regex", "((", "guided_regex"),
        ("guided_json", {"properties": {"a": {"$ref": "#/nowhere"}}}, "guided_json"),
    ],
)
def test_a_schema_that_cannot_compile_is_400_naming_the_field(server, field, value, param):
    for path, body in (("/chat/completions", CHAT), ("/completions", {"model": MODEL_NAME, "prompt": "x"})):
        r = post(server, path, {**body, field: value})
        assert r.status_code == 400, r.text
        check(r.json(), "ErrorResponse")
        assert r.json()["error"]["param"] == param and r.json()["error"]["code"]


def test_two_kinds_of_guidance_are_400(server):
    r = post(server, "/chat/completions", {**CHAT, "response_format": {"type": "json_object"}, "guided_regex": "a"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_regex"


def assert_valid_calls(choice: dict, names=None) -> list:
    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert calls and choice["message"]["content"] is None
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] in (names or SCHEMAS)
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    return calls


def test_tool_choice_required_and_named(server):
    single = chat(server, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, n=3, temperature=1.0, seed=3)
    for choice in single["choices"]:
        assert len(assert_valid_calls(choice)) == 1
    # parallel calls: a random model may go on listing calls until max_tokens (then it is text, "length")
    parallel = chat(server, tools=TOOLS, tool_choice="required", n=3, temperature=1.0, seed=3, max_tokens=200)
    finished = [c for c in parallel["choices"] if c["finish_reason"] == "tool_calls"]
    assert finished and all(c["message"]["content"].startswith("[") for c in parallel["choices"] if c not in finished)
    for choice in finished:
        assert_valid_calls(choice)
    named = chat(
        server,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=1.0,
        seed=8,
    )
    assert len(assert_valid_calls(named["choices"][0], ["get_weather"])) == 1


def test_tool_calls_streamed(server):
    chunks = events(
        server,
        "/chat/completions",
        {**CHAT, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0},
    )
    for c in chunks:
        check(c, "CreateChatCompletionStreamResponse")
    deltas = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("tool_calls")]
    assert len(deltas) == 1 and deltas[0]["finish_reason"] == "tool_calls"
    for call in deltas[0]["delta"]["tool_calls"]:
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


def test_tool_choice_none_and_auto_answer_in_text(server):
    """The tiny model's chat template has no tool format, so "auto" answers in text too."""
    for choice in ("none", "auto", None):
        body = chat(server, tools=TOOLS, tool_choice=choice, max_tokens=5, temperature=0, ignore_eos=True)
        assert body["choices"][0]["finish_reason"] == "length"
        assert "tool_calls" not in body["choices"][0]["message"]


def test_tool_call_round_trip_and_bad_choices(server):
    first = chat(server, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0)
    call = first["choices"][0]["message"]["tool_calls"][0]
    messages = CHAT["messages"] + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
    ]
    chat(server, messages=messages, tools=TOOLS, max_tokens=4)
    unknown = post(
        server,
        "/chat/completions",
        {**CHAT, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    )
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "tool_choice"
    no_tools = post(server, "/chat/completions", {**CHAT, "tool_choice": "required"})
    assert no_tools.status_code == 400 and no_tools.json()["error"]["param"] == "tool_choice"
    bad = post(
        server,
        "/chat/completions",
        {
            **CHAT,
            "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
        },
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
