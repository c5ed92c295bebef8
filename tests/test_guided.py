"""Guided decoding through the whole engine on the tiny random model: whatever it would
say, the output matches the grammar, and a guided sequence's tokens do not depend on its
batch."""

import json
import re

import jsonschema
import pytest
import torch
from tiny_lm import save_tiny_lm

from latentkv import LLM, SamplingParams
from latentkv.guided import GuidedDecodingError, GuidedDecodingParams, closed_objects, escape_regex

# bounded everywhere, so even a random model finishes the object within max_tokens
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "ok": {"type": "boolean"},
        "size": {"type": "integer", "minimum": 0, "maximum": 99},
        "kind": {"enum": ["fox", "dog", "café"]},
    },
    "required": ["name", "ok", "size", "kind"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("guided") / "tiny"
    save_tiny_lm(folder)
    return LLM(str(folder), dtype="float32", block_size=4, kv_cache_memory="2MiB", seed=0)


def run(llm, prompts, guided, **kw):
    params = SamplingParams(max_tokens=kw.pop("max_tokens", 80), guided_decoding=guided, **kw)
    return [o.outputs for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_parses_and_validates(llm, temperature):
    guided = GuidedDecodingParams(json=SCHEMA)
    for outputs in run(llm, ["the quick brown fox", "héllo", "one two"], guided, temperature=temperature, n=2, seed=3):
        for o in outputs:
            assert o.finish_reason == "stop", o.text
            jsonschema.validate(json.loads(o.text), SCHEMA)


def test_json_object_regex_and_choice(llm):
    [[obj]] = run(
        llm,
        ["x"],
        GuidedDecodingParams(
            json={
                "type": "object",
                "properties": {"a": {"type": "integer", "maximum": 9, "minimum": 0}},
                "required": ["a"],
                "additionalProperties": False,
            }
        ),
    )
    assert isinstance(json.loads(obj.text), dict)
    [[rx]] = run(llm, ["x"], GuidedDecodingParams(regex=r"[a-c]{2,4}-[0-9]"), temperature=1.0, seed=1)
    assert re.fullmatch(r"[a-c]{2,4}-[0-9]", rx.text) and rx.finish_reason == "stop"
    choices = ["yes (sure)", "no.", "maybe|not"]
    outs = run(llm, ["a", "b", "c", "d"], GuidedDecodingParams(choice=choices), temperature=1.0, seed=2)
    assert all(o[0].text in choices for o in outs)
    assert escape_regex("a.b|c") == r"a\.b\|c"


def test_guided_sequence_is_batch_invariant(llm):
    guided = SamplingParams(max_tokens=40, temperature=1.0, seed=7, guided_decoding=GuidedDecodingParams(json=SCHEMA))
    alone = llm.generate(["the lazy dog"], guided, use_tqdm=False)[0].outputs[0].token_ids
    others = SamplingParams(max_tokens=30, temperature=1.0, ignore_eos=True)
    mixed = llm.generate(["one", "the lazy dog", "two three"], [others, guided, others], use_tqdm=False)
    assert mixed[1].outputs[0].token_ids == alone


@pytest.mark.parametrize(
    "guided",
    [
        GuidedDecodingParams(json={"type": "nonsense"}, param="response_format"),
        GuidedDecodingParams(json={"properties": {"a": {"$ref": "#/nowhere"}}}, param="response_format"),
        GuidedDecodingParams(regex="((", param="guided_regex"),
        GuidedDecodingParams(json='{"not json', param="response_format"),
    ],
)
def test_bad_grammar_names_its_field(llm, guided):
    with pytest.raises(GuidedDecodingError) as err:
        llm.llm_engine.add_request("bad", "x", SamplingParams(guided_decoding=guided))
    assert err.value.param == guided.param
    assert not llm.llm_engine.has_unfinished_requests()


def test_exactly_one_kind():
    with pytest.raises(GuidedDecodingError):
        GuidedDecodingParams(json={}, regex="a")
    with pytest.raises(GuidedDecodingError):
        GuidedDecodingParams(choice=[])


def test_objects_that_list_properties_are_closed():
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"x": {}}},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
            "pick": {"enum": [{"properties": {}}]},
        },
        "$defs": {"d": {"properties": {"y": {}}}},
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["properties"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["properties"]["properties"]  # a property named so
    assert closed["properties"]["open"]["additionalProperties"] is True
    assert closed["properties"]["pick"] == {"enum": [{"properties": {}}]}
    assert closed["$defs"]["d"]["additionalProperties"] is False


def test_output_has_only_the_listed_fields(llm):
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": [1, 2]}}, "required": ["a"]}
    for outputs in run(llm, ["x", "y z"], GuidedDecodingParams(json=schema), temperature=1.0, n=3, seed=9):
        for o in outputs:
            assert set(json.loads(o.text)) <= {"a", "b"}
