"""A failure inside a step fails only its own request: the others finish as if alone."""

import pytest

from latentkv import SamplingParams
from test_engine import GREEDY, generate, make_llm, token_ids

PROMPTS = [list(range(2, 14)), [7, 250, 8, 9, 10, 11], list(range(60, 75))]


def poison(llm, token: int, message: str = "injected failure"):
    """Every model run whose batch holds `token` raises (a bug only one request triggers)."""
    real_run = llm.engine.runner.run

    def run(out):
        if any(token in s.seq.token_ids for s in out.scheduled):
            raise RuntimeError(message)
        return real_run(out)

    llm.engine.runner.run = run


def test_a_request_that_always_fails_fails_alone_and_frees_its_blocks(tiny_lm):
    folder, _, _ = tiny_lm()
    params = SamplingParams(max_tokens=6, ignore_eos=True, **GREEDY)
    expected = token_ids(generate(make_llm(folder), PROMPTS, params))
    llm = make_llm(folder, kv_cache_memory=12 * 4 * 288)
    poison(llm, 250)
    outs = generate(llm, PROMPTS, params)
    assert outs[1].outputs[0].finish_reason == "error" and "injected failure" in outs[1].error
    assert token_ids([outs[0], outs[2]]) == [expected[0], expected[2]]
    assert [outs[i].outputs[0].finish_reason for i in (0, 2)] == ["length", "length"]
    assert llm.engine.stats()["blocks_used"] == 0 and not llm.engine.has_unfinished_requests()
    # the engine goes on: the same cache serves the good prompts again
    assert token_ids(generate(llm, PROMPTS[::2], params)) == [expected[0], expected[2]]


def test_a_failure_in_one_sequences_bookkeeping_fails_only_it(tiny_lm):
    folder, _, _ = tiny_lm()
    params = SamplingParams(max_tokens=5, ignore_eos=True, **GREEDY)
    expected = token_ids(generate(make_llm(folder), PROMPTS, params))
    llm = make_llm(folder)
    real_append = llm.engine.append_token

    def append(seq, *args):
        if 250 in seq.token_ids and seq.num_output_tokens == 2:
            raise KeyError("bookkeeping bug")
        return real_append(seq, *args)

    llm.engine.append_token = append
    outs = generate(llm, PROMPTS, params)
    assert outs[1].outputs[0].finish_reason == "error" and "bookkeeping bug" in outs[1].error
    assert token_ids([outs[0], outs[2]]) == [expected[0], expected[2]]
    assert llm.engine.stats()["blocks_used"] == 0


def test_a_seeded_request_retried_alone_draws_what_it_would_have(tiny_lm):
    folder, _, _ = tiny_lm()
    seeded = SamplingParams(temperature=1.0, seed=99, max_tokens=8, ignore_eos=True)
    expected = generate(make_llm(folder), [PROMPTS[0]], seeded)[0].outputs[0].token_ids
    llm = make_llm(folder)
    real_run, calls = llm.engine.runner.run, []

    def flaky(out):  # every batched run of more than one sequence fails once it sampled
        result = real_run(out)
        calls.append(len(out.scheduled))
        if len(out.scheduled) > 1:
            raise RuntimeError("batch-only failure")
        return result

    llm.engine.runner.run = flaky
    outs = generate(llm, [PROMPTS[0], PROMPTS[2]], [seeded, SamplingParams(max_tokens=8, **GREEDY)])
    assert any(n > 1 for n in calls)
    assert outs[0].outputs[0].token_ids == expected and outs[0].outputs[0].finish_reason == "length"


@pytest.mark.parametrize("top_k", [2**63 - 1, 10**6])
def test_top_k_past_the_vocabulary_means_all(tiny_lm, top_k):
    folder, _, _ = tiny_lm()
    llm = make_llm(folder)
    base = dict(temperature=1.0, seed=5, max_tokens=6, ignore_eos=True)
    huge = generate(llm, PROMPTS, SamplingParams(top_k=top_k, **base))
    assert token_ids(huge) == token_ids(generate(llm, PROMPTS, SamplingParams(top_k=0, **base)))


@pytest.mark.parametrize(
    "field,value",
    [("temperature", float("inf")), ("top_p", float("nan")), ("repetition_penalty", float("inf")), ("seed", 2**64)],
)
def test_non_finite_or_out_of_range_sampling_values_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_a_cache_smaller_than_max_model_len_caps_it_and_says_so(tiny_lm, capsys):
    folder, _, _ = tiny_lm()
    llm = make_llm(folder, max_model_len=256, kv_cache_memory=10 * 4 * 288)  # 10 blocks of 4 = 40 tokens
    assert llm.engine.max_model_len == llm.engine.capacity_tokens == 40
    assert "max_model_len is capped to 40" in capsys.readouterr().err
    out = generate(llm, [list(range(2, 32))], SamplingParams(max_tokens=100, ignore_eos=True, **GREEDY))[0]
    # finish_reason "length" is the truth: prompt + output reached the (capped) max_model_len
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 40
