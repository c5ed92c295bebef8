"""The OpenAI API through the official `openai` client against a real server; every
answer is checked against the offline `LLM` on the same checkpoint."""

from __future__ import annotations

import pytest

from server_helpers import MODEL_NAME
from latentkv import LLM, SamplingParams

FIXED = {"ignore_eos": True}  # vLLM's extra field: fixed-length outputs for exact checks


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return LLM(model=str(tiny_model_dir), dtype="float32", kv_cache_memory="4MiB", max_model_len=256)


def offline(llm, prompt, **params):
    return llm.generate([prompt], SamplingParams(**params), use_tqdm=False)[0]


def offline_chat(llm, messages, **params):
    return llm.chat(messages, SamplingParams(**params), use_tqdm=False)[0]


def test_models_lists_the_served_name(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert models.data[0].max_model_len == 256


def test_completion_matches_offline_greedy_with_usage(client, reference):
    prompt = "the quick brown fox"
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=10, temperature=0, extra_body=FIXED)
    expected = offline(reference, prompt, max_tokens=10, temperature=0, ignore_eos=True)
    assert r.choices[0].text == expected.outputs[0].text
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(expected.prompt_token_ids) == len(reference.get_tokenizer()(prompt).input_ids)
    assert r.usage.completion_tokens == 10 and r.usage.total_tokens == r.usage.prompt_tokens + 10
    assert r.model == MODEL_NAME and r.id.startswith("cmpl-") and r.created > 0


def test_usage_counts_the_prompt_tokens_served_from_the_prefix_cache(client):
    """OpenAI's usage.prompt_tokens_details.cached_tokens: the full blocks before a prompt's last token,
    once another request has computed them; a prompt never seen before has none."""
    prompt = "an unusual prompt about seven owls " * 4
    first = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=2, temperature=0)
    again = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=2, temperature=0)
    n = first.usage.prompt_tokens
    assert n > 32 and first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16
    assert again.choices[0].text == first.choices[0].text


def test_completion_stream_equals_non_stream(client):
    kwargs = dict(model=MODEL_NAME, prompt="one two three", max_tokens=12, temperature=0, extra_body=FIXED)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_matches_offline_and_streams_the_same(client, reference):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    expected = offline_chat(reference, messages, max_tokens=9, temperature=0, ignore_eos=True)
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_completion_tokens=9, temperature=0, extra_body=FIXED
    )
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected.outputs[0].text
    assert r.usage.prompt_tokens == len(expected.prompt_token_ids) and r.usage.completion_tokens == 9
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=9, temperature=0, stream=True, extra_body=FIXED
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.outputs[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_samples_follow_the_seed(client, reference):
    prompt = "héllo wörld"
    r = client.completions.create(
        model=MODEL_NAME, prompt=prompt, n=3, max_tokens=6, temperature=1.0, seed=11, extra_body=FIXED
    )
    expected = offline(reference, prompt, n=3, max_tokens=6, temperature=1.0, seed=11, ignore_eos=True)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [o.text for o in expected.outputs]
    assert r.usage.completion_tokens == 18


def test_seed_reproduces_sampling(client):
    kwargs = dict(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "tell me"}],
        max_tokens=12,
        temperature=1.0,
        top_p=0.9,
        seed=1234,
        extra_body=FIXED,
    )
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    second = client.chat.completions.create(**kwargs).choices[0].message.content
    other = client.chat.completions.create(**{**kwargs, "seed": 4321}).choices[0].message.content
    assert first == second
    assert len(first) > 0 and (other != first or len(set(first)) == 1)


def test_stop_string_ends_the_text_before_it(client):
    prompt = "the lazy dog"
    greedy = (
        client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0, extra_body=FIXED)
        .choices[0]
        .text
    )
    stop = greedy[8:10]
    assert stop.strip(), f"pick another slice of {greedy!r}"
    cut = greedy[: greedy.find(stop)]
    r = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0, stop=[stop], extra_body=FIXED
    )
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0, stop=stop, stream=True, extra_body=FIXED
        )
    )
    assert streamed == cut


def test_token_id_prompts_and_prompt_lists(client, reference):
    ids = reference.get_tokenizer()("one two three").input_ids
    r = client.completions.create(
        model=MODEL_NAME, prompt=[ids, "five six"], max_tokens=5, temperature=0, n=2, extra_body=FIXED
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    expected_ids = offline(reference, ids, max_tokens=5, temperature=0, ignore_eos=True).outputs[0].text
    expected_text = offline(reference, "five six", max_tokens=5, temperature=0, ignore_eos=True).outputs[0].text
    assert [c.text for c in r.choices] == [expected_ids, expected_ids, expected_text, expected_text]
    assert r.usage.prompt_tokens == len(ids) + len(reference.get_tokenizer()("five six").input_ids)


def test_logprobs_and_echo(client):
    r = client.completions.create(
        model=MODEL_NAME, prompt="one two", max_tokens=4, temperature=0, logprobs=2, extra_body=FIXED
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2 and chosen == pytest.approx(max(top.values()))  # greedy picks the top token
    echoed = client.completions.create(
        model=MODEL_NAME, prompt="one two", max_tokens=4, temperature=0, echo=True, extra_body=FIXED
    )
    assert echoed.choices[0].text == "one two" + r.choices[0].text
    chat = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body=FIXED,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 3 for t in content)
    assert "".join(t.token for t in content) == chat.choices[0].message.content


def test_health_and_metrics(server):
    import httpx

    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "latentkv_requests_total",
        "latentkv_prompt_tokens_total",
        "latentkv_generation_tokens_total",
        "latentkv_num_requests_running",
        "latentkv_num_requests_waiting",
        "latentkv_cache_blocks_used",
        "latentkv_cache_blocks_free",
        "latentkv_prefix_cache_hit_rate",
        "latentkv_num_preemptions_total",
        "latentkv_time_to_first_token_seconds_bucket",
        "latentkv_inter_token_latency_seconds_bucket",
    ):
        assert name in text, name
