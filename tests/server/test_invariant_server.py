"""The same answer every time through the server, in bf16: a greedy request streamed gives the
text it returns unstreamed, the second time (prompt from the prefix cache) too, 16 identical
requests at once all get it, and it is the text `LLM` gives for the same request (completion and
chat)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from openai import OpenAI

from latentkv import LLM, SamplingParams
from server_helpers import MODEL_NAME, start_server

PROMPT = "the quick brown fox jumps over the lazy dog, and then the dog"
GREEDY = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=32, temperature=0, extra_body={"ignore_eos": True})
ENGINE = dict(dtype="bfloat16", max_num_seqs=16, max_model_len=256, kv_cache_memory="8MiB", block_size=4)


@pytest.fixture(scope="module")
def bf16_client(tiny_model_dir):
    running = start_server(tiny_model_dir, **ENGINE)
    yield OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
    running.stop()


def streamed(client) -> str:
    return "".join(chunk.choices[0].text for chunk in client.completions.create(stream=True, **GREEDY))


def test_streamed_returned_cached_and_concurrent_greedy_text_is_one_text(bf16_client):
    first = bf16_client.completions.create(**GREEDY)
    text = first.choices[0].text
    assert first.usage.completion_tokens == 32 and text
    assert streamed(bf16_client) == text  # the prompt now comes from the prefix cache
    assert bf16_client.completions.create(**GREEDY).choices[0].text == text
    with ThreadPoolExecutor(16) as pool:
        texts = list(
            pool.map(
                lambda i: (streamed if i % 2 else lambda c: c.completions.create(**GREEDY).choices[0].text)(
                    bf16_client
                ),
                range(16),
            )
        )
    assert texts == [text] * 16


def test_the_server_and_llm_give_one_text(bf16_client, tiny_model_dir):
    """Completion and chat, plain and streamed, against `LLM` in another engine of the same options
    (the server's engine has served other requests before: its prefix cache is warm)."""
    llm = LLM(str(tiny_model_dir), nan_check=True, **ENGINE)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    assert (
        bf16_client.completions.create(**GREEDY).choices[0].text
        == llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].text
    )
    messages = [{"role": "user", "content": PROMPT}]
    expected = llm.chat(messages, params, use_tqdm=False)[0].outputs[0].text
    chat = dict(model=MODEL_NAME, messages=messages, max_tokens=32, temperature=0, extra_body={"ignore_eos": True})
    for _ in range(2):  # the second time from the prefix cache
        assert bf16_client.chat.completions.create(**chat).choices[0].message.content == expected
        parts = bf16_client.chat.completions.create(stream=True, **chat)
        assert "".join(c.choices[0].delta.content or "" for c in parts if c.choices) == expected
