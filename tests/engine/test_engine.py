"""Engine behaviour on tiny random DeepSeek models: batching, preemption, prefix caching."""

import random

import pytest
import torch

from latentkv import LLM, SamplingParams
from latentkv.engine.args import BATCHED_TOKENS
from latentkv.model.quant import Int4Linear, Int8Linear, W4A8Linear, W8A8Linear

GREEDY = dict(temperature=0.0)


def make_llm(folder, **kw):
    opts = dict(dtype="float32", block_size=4, kv_cache_memory="4MiB", max_num_seqs=32, seed=0)
    opts.update(kw)
    return LLM(str(folder), **opts)


def random_requests(n, seed, vocab=300, max_prompt=40, max_out=24):
    rng = random.Random(seed)
    prompts = [[rng.randrange(2, vocab) for _ in range(rng.randint(3, max_prompt))] for _ in range(n)]
    params = [SamplingParams(max_tokens=rng.randint(1, max_out), **GREEDY) for _ in range(n)]
    return prompts, params


def token_ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def generate(llm, prompts, params):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def hf_greedy(model, prompt, max_tokens):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False, eos_token_id=1
        )
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("name", ["v3_dense_qlora", "v2_moe_group_limited", "v3_yarn_halves_tied"])
def test_32_concurrent_greedy_equal_alone_and_transformers(tiny_lm, name, attention_backend):
    folder, hf_model, _ = tiny_lm(name)
    prompts, params = random_requests(32, seed=1)
    # a small token budget mixes decodes with chunked prefills in the same steps
    llm = make_llm(folder, max_num_batched_tokens=48, attention_backend=attention_backend)
    batched = token_ids(generate(llm, prompts, params))
    alone = [token_ids(generate(llm, [p], [sp]))[0] for p, sp in zip(prompts, params)]
    assert batched == alone
    reference = [hf_greedy(hf_model, p, sp.max_tokens) for p, sp in zip(prompts, params)]
    assert batched == reference
    assert sum(len(t) for t in batched) > 200  # real work was done
    stats = llm.engine.stats()
    assert stats["blocks_free"] == stats["num_blocks"] and stats["running"] == stats["waiting"] == 0


def test_preemption_changes_no_output_and_returns_blocks(tiny_lm):
    folder, _, _ = tiny_lm()
    prompts, params = random_requests(12, seed=2, max_prompt=20, max_out=30)
    params = [SamplingParams(max_tokens=30, **GREEDY) for _ in prompts]
    expected = token_ids(generate(make_llm(folder), prompts, params))
    for caching in (True, False):
        # 40 blocks of 4 tokens: the 12 requests need ~150 blocks at their peak
        small = make_llm(folder, kv_cache_memory=40 * 4 * 288, enable_prefix_caching=caching)
        assert small.engine.stats()["num_blocks"] == 40
        got = token_ids(generate(small, prompts, params))
        stats = small.engine.stats()
        assert stats["preemptions"] > 0
        assert got == expected
        assert stats["blocks_free"] == stats["num_blocks"]
        assert all(b.ref_count == 0 for b in small.engine.pool.blocks)


def test_prefix_cache_hits_shared_blocks_and_keeps_outputs(tiny_lm):
    folder, _, _ = tiny_lm()
    rng = random.Random(3)
    shared = [rng.randrange(2, 300) for _ in range(12)]  # 3 full blocks of 4
    first = shared + [5, 6]  # + a partial block
    second = shared + [5, 9, 10]  # same partial start, then differs
    third = shared + [7, 8, 11, 12, 13]
    params = SamplingParams(max_tokens=8, **GREEDY)
    llm = make_llm(folder)
    off = make_llm(folder, enable_prefix_caching=False)
    results = []
    for prompt in (first, second, third):
        before = llm.engine.stats()
        out = generate(llm, [prompt], [params])[0]
        after = llm.engine.stats()
        results.append((out, after["prefix_hits"] - before["prefix_hits"]))
        assert out.outputs[0].token_ids == generate(off, [prompt], [params])[0].outputs[0].token_ids
    assert results[0][1] == 0
    # the 3 shared full blocks hit; the first request's 4th block ([5, 6] + its outputs)
    # was completed with other tokens and must not be shared with [5, 9, 10, ...]
    assert results[1][1] == 3 and results[1][0].num_cached_tokens == 12
    assert results[2][1] == 3
    assert off.engine.stats()["prefix_hits"] == 0
    # a repeated prompt hits all its full blocks but still computes its last token
    again = generate(llm, [second], [params])[0]
    assert again.num_cached_tokens == 12 and again.outputs[0].token_ids == results[1][0].outputs[0].token_ids
    stats = llm.engine.stats()
    assert stats["blocks_free"] == stats["num_blocks"]


def test_abort_frees_blocks(tiny_lm):
    folder, _, _ = tiny_lm()
    llm = make_llm(folder)
    engine = llm.engine
    engine.add_request("a", list(range(2, 30)), SamplingParams(max_tokens=50, **GREEDY))
    engine.add_request("b", list(range(40, 50)), SamplingParams(max_tokens=5, **GREEDY))
    for _ in range(3):
        engine.step()
    used = engine.stats()["blocks_used"]
    final = engine.abort_request("a")
    assert final.finished and final.outputs[0].finish_reason == "abort"
    assert engine.stats()["blocks_used"] < used
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert [o.request_id for o in outs if o.finished] == ["b"]
    assert outs[-1].outputs[0].finish_reason == "length" and len(outs[-1].outputs[0].token_ids) == 5
    assert engine.stats()["blocks_used"] == 0


def test_too_long_prompt_rejected_others_finish(tiny_lm):
    folder, _, _ = tiny_lm()
    llm = make_llm(folder, max_model_len=32)
    prompts = [list(range(2, 12)), list(range(2, 40)), list(range(50, 60))]
    outs = generate(llm, prompts, SamplingParams(max_tokens=4, **GREEDY))
    assert outs[1].outputs[0].finish_reason == "error" and "max_model_len" in outs[1].error
    assert [outs[i].outputs[0].finish_reason for i in (0, 2)] == ["length", "length"]
    assert all(len(outs[i].outputs[0].token_ids) == 4 for i in (0, 2))
    with pytest.raises(ValueError, match="max_model_len"):
        llm.engine.add_request("x", list(range(2, 40)), SamplingParams())
    # a prompt that fits max_model_len but not the whole cache is rejected too
    tiny_cache = make_llm(folder, kv_cache_memory=4 * 4 * 288)
    with pytest.raises(ValueError, match="whole KV cache"):
        tiny_cache.engine.add_request("y", list(range(2, 40)), SamplingParams())
    # generation is cut at max_model_len
    out = generate(llm, [list(range(2, 30))], SamplingParams(max_tokens=20, ignore_eos=True, **GREEDY))[0]
    assert out.outputs[0].finish_reason == "length" and len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 32


def test_nan_in_logits_finishes_only_that_request(tiny_lm):
    folder, _, _ = tiny_lm()
    prompts = [list(range(2, 14)), [7, 250, 8, 9, 10, 11], list(range(60, 75))]
    params = SamplingParams(max_tokens=6, **GREEDY)
    expected = token_ids(generate(make_llm(folder), prompts, params))
    # 12 blocks: the later requests must reuse the NaN request's blocks
    llm = make_llm(folder, nan_check=True, kv_cache_memory=12 * 4 * 288)
    with torch.no_grad():
        llm.engine.model.model.embed_tokens.weight[250] = float("nan")
    outs = generate(llm, prompts, params)
    assert outs[1].outputs[0].finish_reason == "error" and "NaN" in outs[1].error
    assert token_ids([outs[0], outs[2]]) == [expected[0], expected[2]]
    # its blocks were scrubbed: later requests reusing them (their unwritten slots are
    # read under a mask, and 0 x NaN = NaN) are unaffected
    assert token_ids(generate(llm, prompts[::2], params)) == [expected[0], expected[2]]
    assert token_ids(generate(llm, [prompts[2]], params)) == [expected[2]]


def test_attention_paths_agree(tiny_lm):
    folder, _, _ = tiny_lm("v2_moe_group_limited")
    prompts, params = random_requests(8, seed=5)
    outs = {
        path: token_ids(generate(make_llm(folder, attention_path=path, max_num_batched_tokens=32), prompts, params))
        for path in ("naive", "absorbed", "auto")
    }
    assert outs["naive"] == outs["absorbed"] == outs["auto"]


def test_default_cache_budget_is_capped_by_what_can_be_used(tiny_lm, capsys):
    folder, _, _ = tiny_lm()
    llm = LLM(str(folder), dtype="float32", block_size=16, max_num_seqs=4, max_model_len=100)
    # a fraction of free memory, but never more than 4 sequences x 100 tokens need
    assert llm.engine.stats()["capacity_tokens"] == 4 * 112
    assert "448 tokens" in capsys.readouterr().err


def test_the_default_token_budget_chunks_a_long_prompt(tiny_lm):
    """No max_num_batched_tokens: a step takes BATCHED_TOKENS tokens (a longer prompt in chunks), or
    max_num_seqs where that is more."""
    folder, _, _ = tiny_lm()
    for seqs, budget in ((4, BATCHED_TOKENS), (BATCHED_TOKENS + 8, BATCHED_TOKENS + 8)):
        llm = make_llm(folder, max_num_seqs=seqs, kv_cache_memory="16MiB", max_model_len=3 * BATCHED_TOKENS)
        engine = llm.engine
        prompt = [2 + i % 300 for i in range(2 * BATCHED_TOKENS + 5)]
        engine.add_request("long", prompt, SamplingParams(max_tokens=1, **GREEDY))
        assert engine.scheduler.schedule().num_tokens == budget


@pytest.mark.parametrize("kind", ["int8", "int4", "w4a8", "w8a8"])
def test_weight_quantized_engine_batches_like_alone(tiny_lm, kind):
    """Quantized linears change the numbers, not the engine: concurrent greedy requests give
    what each gives alone, and most tokens still match the float model."""
    folder, _, _ = tiny_lm("v3_dense_qlora")
    prompts, params = random_requests(12, seed=3)
    llm = make_llm(folder, quantization=kind, max_num_batched_tokens=48)
    cls = {"int8": Int8Linear, "int4": Int4Linear, "w4a8": W4A8Linear, "w8a8": W8A8Linear}[kind]
    assert any(isinstance(m, cls) for m in llm.engine.runner.model.modules())
    batched = token_ids(generate(llm, prompts, params))
    assert batched == [token_ids(generate(llm, [p], [sp]))[0] for p, sp in zip(prompts, params)]
    plain = token_ids(generate(make_llm(folder), prompts, params))
    first = [a[0] == b[0] for a, b in zip(batched, plain)]
    assert sum(first) >= len(first) // 2, f"{kind}: first tokens agree on {sum(first)} of {len(first)}"


def test_bad_quantization_names_the_field(tiny_lm):
    folder, _, _ = tiny_lm("v3_dense_qlora")
    with pytest.raises(ValueError, match="quantization"):
        make_llm(folder, quantization="int3")
