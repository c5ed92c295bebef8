"""The same answer every time: greedy tokens identical (not close) alone, in a batch of 16 mixed
requests, with chunked prefill, with the prompt prefix-cached, and 16 identical requests at once —
in bf16 and float32, through both attention backends (batch_invariant is the default)."""

import random

import pytest
import torch

from latentkv import LLM, SamplingParams
from latentkv.attention import native_backend
from latentkv.kernels import attention as attention_kernels

N_TOKENS = 24


def requests(n=16, seed=3, vocab=120):
    rng = random.Random(seed)
    prompts = [[rng.randrange(2, vocab) for _ in range(rng.randint(5, 60))] for _ in range(n)]
    params = [
        SamplingParams(temperature=0, max_tokens=rng.randint(N_TOKENS // 2, N_TOKENS), ignore_eos=True)
        for _ in range(n)
    ]
    return prompts, params


def greedy(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("name", ["v3_dense_qlora", "v2_moe_group_limited"])
def test_greedy_is_identical_alone_batched_chunked_and_cached(tiny_lm, name, dtype, attention_backend):
    if dtype == "bfloat16" and name != "v3_dense_qlora" and attention_backend == "torch":
        pytest.skip("one bf16 model through the reference backend keeps the suite short")
    folder, _, _ = tiny_lm(name)
    check_identical(folder, dtype, attention_backend)


@pytest.mark.parametrize(
    "quantization,dtype",
    [("int4", "float32"), ("int8", "float32"), ("w4a8", "float32"), ("w4a8", "bfloat16"), ("w4a8_g128", "bfloat16")],
)
def test_weight_quantized_greedy_is_identical_alone_batched_chunked_and_cached(
    tiny_lm, quantization, dtype, attention_backend
):
    """The int4 / int8 linears (kernels/qlinear.py) get no padding from invariant.py: their rows must
    not depend on the batch by themselves (bf16: `dtype="auto"` on a bf16 CPU with --quantization)."""
    folder, _, _ = tiny_lm("v3_dense_qlora")
    check_identical(folder, dtype, attention_backend, quantization=quantization)


@pytest.mark.parametrize(
    "cache_dtype,dtype",
    [("int8_rope8", "bfloat16"), ("int8_rope8", "float32"), ("q4_0", "bfloat16"), ("q4_0", "float32")],
)
def test_greedy_over_an_8_bit_rope_cache_is_identical_alone_batched_chunked_and_cached(
    tiny_lm, cache_dtype, dtype, attention_backend
):
    """The rope key in int8 (a scale of its own per token), or latent and rope key in q4_0 blocks
    (the rope key turned; the native kernel reads it with a turned query, the prefill paths turned
    back), read by every path: batch invariance holds."""
    folder, _, _ = tiny_lm("v3_dense_qlora")
    check_identical(folder, dtype, attention_backend, kv_cache_dtype=cache_dtype)


def check_identical(folder, dtype, attention_backend, **engine):
    prompts, params = requests()

    def llm(**kw):
        return LLM(
            str(folder),
            dtype=dtype,
            block_size=4,
            kv_cache_memory="4MiB",
            max_num_seqs=16,
            attention_backend=attention_backend,
            **engine,
            **kw,
        )

    plain = llm(enable_prefix_caching=False)
    alone = [greedy(plain, [p], [sp])[0] for p, sp in zip(prompts, params)]
    assert greedy(plain, prompts, params) == alone  # 16 mixed requests in one batch
    assert greedy(llm(enable_prefix_caching=False, max_num_batched_tokens=16), prompts, params) == alone  # chunked
    cached = llm()
    assert greedy(cached, prompts, params) == alone
    again = greedy(cached, prompts, params)  # every prompt now comes from the prefix cache
    assert cached.engine.stats()["prefix_hits"] > 0 and again == alone
    same = greedy(cached, [prompts[0]] * 16, [params[0]] * 16)  # 16 identical requests at once
    assert same == [alone[0]] * 16


def test_batch_invariant_can_be_turned_off_and_is_validated(tiny_lm):
    folder, _, _ = tiny_lm()
    llm = LLM(str(folder), dtype="float32", block_size=4, kv_cache_memory="1MiB", batch_invariant=False)
    assert llm.engine.runner.batch_invariant is False
    with pytest.raises(ValueError, match="batch_invariant"):
        LLM(str(folder), batch_invariant="sometimes")


def greedy_logprobs(llm, prompts, params):
    """-> per request (tokens, the chosen tokens' logprobs): floats, so a changed bit anywhere shows."""
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].cumulative_logprob) for o in outs]


def test_a_multi_turn_prompt_gets_the_same_answer_from_a_fresh_engine_and_the_one_that_served_turn_1(
    tiny_lm, attention_backend
):
    """Turn 2's prompt holds turn 1's answer, whose latents decode computed; a prompt's own prefill
    computes them another way (attention/prefill.py), so the engine shares only prompt blocks."""
    folder, _, _ = tiny_lm()
    rng = random.Random(5)
    turn1 = [rng.randrange(2, 120) for _ in range(23)]
    params = SamplingParams(temperature=0, max_tokens=21, ignore_eos=True, logprobs=0)

    def llm():
        return LLM(
            str(folder), dtype="bfloat16", block_size=4, kv_cache_memory="4MiB", attention_backend=attention_backend
        )

    served = llm()
    answer = greedy_logprobs(served, [turn1], [params])[0][0]
    turn2 = turn1 + answer + [rng.randrange(2, 120) for _ in range(9)]
    again = greedy_logprobs(served, [turn2], [params])
    assert served.engine.stats()["prefix_hits"] == len(turn1) // 4  # turn 1's prompt blocks, not its answer's
    assert again == greedy_logprobs(llm(), [turn2], [params])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_preempted_and_recomputed_requests_keep_their_tokens_and_logprobs(tiny_lm, dtype, attention_backend):
    """A preempted request's generated tokens are recomputed in a multi-token step: they take the
    decode kernel again (backend.attend_prompt), so nothing changes, to the last bit."""
    folder, _, _ = tiny_lm()
    prompts, _ = requests(n=10, seed=7)
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=0) for _ in prompts]

    def llm(**kw):
        return LLM(str(folder), dtype=dtype, block_size=4, attention_backend=attention_backend, **kw)

    plain = llm(kv_cache_memory="4MiB")
    alone = [greedy_logprobs(plain, [p], [sp])[0] for p, sp in zip(prompts, params)]
    for caching in (True, False):
        small = llm(kv_cache_blocks=48, enable_prefix_caching=caching)
        assert greedy_logprobs(small, prompts, params) == alone
        assert small.engine.stats()["preemptions"] > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_without_invariance_a_prefill_chunk_takes_the_native_prompt_kernel_too(tiny_lm, monkeypatch, dtype):
    """batch_invariant=False: a one-sequence prefill chunk (also over cached context) goes to the
    native prompt kernel (float32 and bf16, every ISA) and agrees with the reference backend."""
    if not attention_kernels.available() or not attention_kernels.prefill_supported(getattr(torch, dtype)):
        pytest.skip(f"the native prefill kernel does not take {dtype}")
    calls = []
    kernel = attention_kernels.mla_prefill
    monkeypatch.setattr(
        native_backend, "mla_prefill", lambda *a, **k: calls.append(1) or kernel(*a, **k)
    )  # what NativeBackend calls
    folder, _, _ = tiny_lm()
    prompts = [list(range(2, 90)), list(range(5, 40))]
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=0, ignore_eos=True)

    def first(backend):
        llm = LLM(
            str(folder),
            dtype=dtype,
            block_size=4,
            kv_cache_memory="4MiB",
            batch_invariant=False,
            max_num_batched_tokens=32,
            max_num_seqs=4,
            attention_backend=backend,
        )
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [o.outputs[0].cumulative_logprob for o in outs]

    ours, reference = first("native"), first("torch")
    tol = {"float32": 1e-3, "bfloat16": 0.05}[dtype]
    assert calls and all(abs(a - b) <= tol for a, b in zip(ours, reference)), (ours, reference)
