"""The `LLM` facade and sampling behaviour through the whole engine, on a tiny model
with a byte-level BPE tokenizer."""

import random

import pytest
import torch

from latentkv import LLM, SamplingParams
from latentkv.engine.detokenizer import detokenize_incrementally
from latentkv.engine.sequence import Sequence

GREEDY = dict(temperature=0.0)


@pytest.fixture(scope="module")
def llm(tiny_lm):
    folder, _, _ = tiny_lm("v3_dense_qlora")
    return LLM(str(folder), dtype="float32", block_size=4, kv_cache_memory="2MiB", seed=0)


def ids_prompt(ids):
    return {"prompt_token_ids": list(ids)}


def test_text_prompts_and_output_shape(llm):
    outs = llm.generate(
        ["the quick brown fox", "héllo wörld"], SamplingParams(max_tokens=7, ignore_eos=True, **GREEDY), use_tqdm=False
    )
    tok = llm.get_tokenizer()
    for out, text in zip(outs, ["the quick brown fox", "héllo wörld"]):
        assert out.prompt == text and out.prompt_token_ids == tok(text).input_ids
        o = out.outputs[0]
        assert len(o.token_ids) == 7 and o.finish_reason == "length" and out.finished
        assert o.text == tok.decode(o.token_ids, skip_special_tokens=True)


def test_seed_reproducible_regardless_of_batch(llm):
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=16, ignore_eos=True)
    prompt = ids_prompt(range(10, 30))
    alone = llm.generate([prompt], seeded, use_tqdm=False)[0].outputs[0].token_ids
    rng = random.Random(0)
    others = [ids_prompt([rng.randrange(2, 300) for _ in range(rng.randint(3, 30))]) for _ in range(5)]
    noisy = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    batch = llm.generate(others[:2] + [prompt] + others[2:], [noisy] * 2 + [seeded] + [noisy] * 3, use_tqdm=False)
    assert batch[2].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, seed=4321, max_tokens=16, ignore_eos=True)
    assert llm.generate([prompt], other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone
    greedy = llm.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True, **GREEDY), use_tqdm=False)[0]
    assert greedy.outputs[0].token_ids != alone  # it really sampled


def test_top_k_1_equals_greedy(llm):
    prompts = [ids_prompt(range(s, s + 12)) for s in (5, 50, 100)]
    greedy = llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True, **GREEDY), use_tqdm=False)
    top1 = llm.generate(
        prompts, SamplingParams(temperature=1.5, top_k=1, max_tokens=12, ignore_eos=True), use_tqdm=False
    )
    assert [o.outputs[0].token_ids for o in greedy] == [o.outputs[0].token_ids for o in top1]


def test_n_samples(llm):
    out = llm.generate(
        [ids_prompt(range(3, 20))],
        SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) == 3
    again = llm.generate(
        [ids_prompt(range(3, 20))],
        SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in out.outputs]


def clean_substring(text, length=2):
    """A stop string from the middle of `text`, free of replacement characters."""
    for start in range(len(text) // 3, len(text) - length):
        piece = text[start : start + length]
        if "\ufffd" not in piece and piece.strip():
            return piece
    raise AssertionError(f"no usable substring in {text!r}")


def test_stop_strings_cut_text_and_never_stream(llm):
    prompt = "the lazy dog"
    full = llm.generate([prompt], SamplingParams(max_tokens=30, ignore_eos=True, **GREEDY), use_tqdm=False)[0].outputs[
        0
    ]
    stop = clean_substring(full.text)
    engine = llm.engine
    engine.add_request(
        "stop-test", prompt, SamplingParams(max_tokens=30, ignore_eos=True, stop=[stop, "\x00never"], **GREEDY)
    )
    streamed = []
    while engine.has_unfinished_requests():
        streamed += [o for o in engine.step() if o.request_id == "stop-test"]
    final = streamed[-1].outputs[0]
    assert final.finish_reason == "stop" and final.stop_reason == stop
    assert final.text == full.text[: full.text.index(stop)]
    assert full.token_ids[: len(final.token_ids)] == final.token_ids and len(final.token_ids) < 30
    for o in streamed:
        assert stop not in o.outputs[0].text and final.text.startswith(o.outputs[0].text)


def test_stop_token_ids_eos_min_tokens_and_ignore_eos(llm):
    prompt = ids_prompt(range(20, 36))
    full = (
        llm.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True, **GREEDY), use_tqdm=False)[0]
        .outputs[0]
        .token_ids
    )
    k = next(i for i in range(2, 12) if full[i] not in full[:i])
    out = llm.generate([prompt], SamplingParams(max_tokens=12, stop_token_ids=[full[k]], **GREEDY), use_tqdm=False)[
        0
    ].outputs[0]
    assert out.token_ids == full[: k + 1] and out.finish_reason == "stop" and out.stop_reason == full[k]
    tok = llm.get_tokenizer()
    assert out.text == tok.decode(full[:k], skip_special_tokens=True)
    # the same token as EOS (the engine's EOS list, as read from the checkpoint)
    saved = list(llm.engine.eos_token_ids)
    llm.engine.eos_token_ids[:] = [full[k]]
    try:
        out = llm.generate([prompt], SamplingParams(max_tokens=12, **GREEDY), use_tqdm=False)[0].outputs[0]
        assert out.token_ids == full[: k + 1] and out.finish_reason == "stop" and out.stop_reason is None
        out = llm.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True, **GREEDY), use_tqdm=False)[
            0
        ].outputs[0]
        assert out.token_ids == full and out.finish_reason == "length"
        out = llm.generate([prompt], SamplingParams(max_tokens=12, min_tokens=k + 2, **GREEDY), use_tqdm=False)[
            0
        ].outputs[0]
        assert out.token_ids[:k] == full[:k] and out.token_ids[k] != full[k]  # EOS masked while too short
    finally:
        llm.engine.eos_token_ids[:] = saved


def test_logprobs_match_full_forward(llm):
    prompt = list(range(40, 58))
    out = llm.generate(
        [ids_prompt(prompt)],
        SamplingParams(max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2, **GREEDY),
        use_tqdm=False,
    )[0]
    gen = out.outputs[0]
    seq = prompt + gen.token_ids
    ref = torch.log_softmax(llm.engine.model.full_logits(torch.tensor([seq]))[0], dim=-1)
    # generated tokens: greedy picks rank 1; top-3 plus the chosen token
    assert len(gen.logprobs) == 6
    for i, (token, d) in enumerate(zip(gen.token_ids, gen.logprobs)):
        row = ref[len(prompt) + i - 1]
        assert d[token].rank == 1 and len(d) == 3
        assert d[token].logprob == pytest.approx(row[token].item(), abs=1e-4)
        assert sorted(d) == sorted(row.topk(3).indices.tolist())
    assert gen.cumulative_logprob == pytest.approx(sum(d[t].logprob for t, d in zip(gen.token_ids, gen.logprobs)))
    # prompt logprobs: None for the first token, then the actual token plus the top 2
    plp = out.prompt_logprobs
    assert len(plp) == len(prompt) and plp[0] is None
    for p in range(1, len(prompt)):
        assert plp[p][prompt[p]].logprob == pytest.approx(ref[p - 1, prompt[p]].item(), abs=1e-4)
        assert set(ref[p - 1].topk(2).indices.tolist()) <= set(plp[p])
        assert plp[p][prompt[p]].decoded_token == llm.get_tokenizer().decode([prompt[p]])


def test_prompt_logprobs_with_chunked_prefill(tiny_lm):
    folder, _, _ = tiny_lm("v3_dense_qlora")
    small_steps = LLM(
        str(folder), dtype="float32", block_size=4, kv_cache_memory="1MiB", max_num_seqs=4, max_num_batched_tokens=5
    )
    one_step = LLM(str(folder), dtype="float32", block_size=4, kv_cache_memory="1MiB")
    params = SamplingParams(max_tokens=3, prompt_logprobs=1, **GREEDY)
    a = small_steps.generate([ids_prompt(range(60, 83))], params, use_tqdm=False)[0]
    b = one_step.generate([ids_prompt(range(60, 83))], params, use_tqdm=False)[0]
    assert len(a.prompt_logprobs) == 23 and a.outputs[0].token_ids == b.outputs[0].token_ids
    for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
        assert x.keys() == y.keys() and all(x[k].logprob == pytest.approx(y[k].logprob, abs=1e-4) for k in x)


def test_incremental_detokenization_multibyte(llm):
    tok = llm.get_tokenizer()
    target = "héllo 日本語 😀🎉 café"
    ids = tok(target, add_special_tokens=False).input_ids
    # the test means something only if some token alone is an incomplete character
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    seq = Sequence("d", tok("the ", add_special_tokens=False).input_ids, SamplingParams())
    for i in ids:
        seq.append_token(i)
        detokenize_incrementally(tok, seq)
        assert "\ufffd" not in seq.text and target.startswith(seq.text)
    assert seq.text == target


def test_chat_uses_template(llm):
    messages = [{"role": "user", "content": "héllo there"}]
    out = llm.chat(messages, SamplingParams(max_tokens=5, ignore_eos=True, **GREEDY), use_tqdm=False)[0]
    tok = llm.get_tokenizer()
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("assistant:") and out.prompt == text
    assert out.prompt_token_ids == tok(text, add_special_tokens=False).input_ids
    direct = llm.generate(
        [ids_prompt(out.prompt_token_ids)], SamplingParams(max_tokens=5, ignore_eos=True, **GREEDY), use_tqdm=False
    )[0]
    assert direct.outputs[0].token_ids == out.outputs[0].token_ids


def test_skip_tokenizer_init_without_tokenizer_files(tiny_lm, llm):
    folder, _, _ = tiny_lm("v3_dense_qlora", tokenizer=False)
    assert not (folder / "tokenizer.json").exists()
    bare = LLM(str(folder), dtype="float32", block_size=4, kv_cache_memory="1MiB", skip_tokenizer_init=True)
    assert bare.get_tokenizer() is None
    params = SamplingParams(max_tokens=6, ignore_eos=True, **GREEDY)
    out = bare.generate([ids_prompt(range(5, 15)), list(range(7, 12))], params, use_tqdm=False)
    ref = llm.generate([ids_prompt(range(5, 15)), ids_prompt(range(7, 12))], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in ref]
    assert all(o.outputs[0].text == "" for o in out)
    rejected = bare.generate(["text needs a tokenizer"], params, use_tqdm=False)[0]
    assert rejected.outputs[0].finish_reason == "error" and "tokenizer" in rejected.error


def test_bad_options_rejected(tiny_lm):
    folder, _, _ = tiny_lm("v3_dense_qlora")
    with pytest.raises(TypeError, match="unknown option"):
        LLM(str(folder), kv_cache_memry="1MiB")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(str(folder), kv_cache_dtype="int4", kv_cache_memory="1MiB")
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        LLM(str(folder), kv_cache_memory="1MiB", max_num_seqs=8, max_num_batched_tokens=4)
    with pytest.raises(ValueError, match="memory size"):
        LLM(str(folder), kv_cache_memory="lots")
