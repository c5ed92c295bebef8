"""The README's demo question gets the README's answer from the default conversion of the real
bundled model (greedy), in float32 and, where the CPU has bf16 instructions, in bf16 — there the
same answer through `LLM.chat` and the server (plain, streamed, from the prefix cache).

One conversion, by the server's own path (`resolve_model(None)`), into the test session's cache
(tests/conftest.py: never the user's); `make test-slow` runs it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from openai import OpenAI

from latentkv.cpu import native_bf16
from latentkv.llm import LLM
from latentkv.resolve import resolve_model
from latentkv.sampling_params import SamplingParams
from server.server_helpers import MODEL_NAME, start_server

README = Path(__file__).parents[1] / "README.md"
GREEDY = SamplingParams(temperature=0.0, max_tokens=32)
pytestmark = pytest.mark.slow  # the default conversion of the real bundled model (minutes, in a fresh cache)


def readme_demo() -> tuple[str, str, list[str]]:
    """(question, float32 answer, the answers the README allows in bf16) of the README's chat example."""
    text = README.read_text()
    question = re.search(r'"role": "user", "content": "([^"]+)"', text).group(1)
    answer = re.search(r"^answers `(.+?)`", text, re.M)
    assert answer, "the README shows the demo's answer on a line starting: answers `...`"
    bf16 = re.search(r"^in bf16 it answers (.+)$", text, re.M)
    assert bf16, "the README says what the demo answers in bf16 on a line starting: in bf16 it answers"
    return question, answer.group(1), re.findall(r"`([^`]+)`", bf16.group(1))


def test_the_default_conversion_answers_the_readme_question():
    question, answer, _ = readme_demo()
    llm = LLM(str(resolve_model(None).path), dtype="float32", kv_cache_dtype="auto", max_model_len=256)
    out = llm.chat([{"role": "user", "content": question}], GREEDY, use_tqdm=False)
    assert out[0].outputs[0].text.strip().startswith(answer)  # the README shows its beginning


@pytest.mark.skipif(
    not native_bf16(), reason="bf16 is emulated on this CPU (~1% of float32): bf16 runs where dtype='auto' picks it"
)
@pytest.mark.parametrize("cache", ["auto", "int8"])  # auto: the folder's int8_rope8, what `make serve` runs
def test_in_bf16_one_answer_on_every_path_and_the_readme_says_which(cache):
    question, _, allowed = readme_demo()
    folder = resolve_model(None).path
    engine = dict(dtype="bfloat16", kv_cache_dtype=cache, max_model_len=256, kv_cache_memory="64MiB")
    messages = [{"role": "user", "content": question}]
    text = LLM(str(folder), **engine).chat(messages, GREEDY, use_tqdm=False)[0].outputs[0].text
    assert any(text.strip().startswith(a) for a in allowed), text
    running = start_server(folder, **engine)
    try:
        client = OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
        request = dict(model=MODEL_NAME, messages=messages, max_tokens=32, temperature=0)
        for _ in range(2):  # the second time from the prefix cache
            assert client.chat.completions.create(**request).choices[0].message.content == text
            parts = client.chat.completions.create(stream=True, **request)
            assert "".join(c.choices[0].delta.content or "" for c in parts if c.choices) == text
    finally:
        running.stop()
