"""Grouped rope keys (model/rope_groups.py): found on query rows with the structure an exact GQA
conversion leaves, the un-mixed scores equal the shared key's under RoPE at every position; not
found where the structure does not hold; the folded query projection gives the un-mixed query and
the decode plan its bits. A converted model's prefill with them, without its zero nope part
(MLAttention.scores_nope) and with one kv row per group (MLAttention.kv_groups) matches the one
with the shared key, the nope part and per-head rows (float32) and stays batch-invariant (chunked
= whole, bf16 and float32)."""

import pytest
import torch

from latentkv import LLM, SamplingParams
from latentkv.model import decode_plan, fused
from latentkv.model.loader import load_model
from latentkv.model.mla import MLAttention
from latentkv.model.quant import QuantLinear
from latentkv.model.route import decide_route
from latentkv.rope import apply_rope, cos_sin
from latentkv.model.rope_groups import find

from latentkv.convert.calibrate import collect_stats
from latentkv.convert.export import export
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model
from latentkv.sources.readers import read_source

import llama_tiny
from test_decode_plan import assert_plan_gives_the_modules_bits, random_caches

native = pytest.mark.skipif(not fused.available(), reason="the native per-layer ops are not built here")


def structured(heads=6, groups=2, counts=(3, 3, 1, 2), k=24, interleaved=True, seed=0):
    """Query rope rows [H, dr, K] of the conversion's form: at a frequency with n slots, head h's
    rows are s_h c_g ⊗ p_h (c_g a unit vector over the slots, one per group of consecutive
    heads); the slots of the frequencies in a shuffled order. -> (rows, inv_freq [dr/2])."""
    gen = torch.Generator().manual_seed(seed)
    freq_of_slot = torch.tensor([1.0 / (i + 1) for i, n in enumerate(counts) for _ in range(n)])
    order = torch.randperm(len(freq_of_slot), generator=gen)
    inv_freq = freq_of_slot[order]
    half = len(inv_freq)
    rows = torch.zeros(heads, 2 * half, k, dtype=torch.float64)
    for f in inv_freq.unique():
        slots = (inv_freq == f).nonzero().flatten()
        c = torch.nn.functional.normalize(torch.randn(groups, len(slots), generator=gen, dtype=torch.float64), dim=1)
        for h in range(heads):
            pair = torch.randn(2, k, generator=gen, dtype=torch.float64) * (0.5 + torch.rand(1, generator=gen).item())
            for j, s in enumerate(slots.tolist()):
                dims = (2 * s, 2 * s + 1) if interleaved else (s, s + half)
                rows[h, dims[0]], rows[h, dims[1]] = c[h // (heads // groups), j] * pair
    return rows.float(), inv_freq


@native
@pytest.mark.parametrize("interleaved", [True, False])
@torch.inference_mode()
def test_unmixed_scores_equal_the_shared_keys_under_rope(interleaved):
    rows, inv_freq = structured(interleaved=interleaved)
    groups = find(rows, inv_freq, interleaved)
    assert groups is not None and groups.groups == 2 and groups.heads_per_group == 3
    assert groups.basis.shape == (2, rows.shape[1], 2 * len(inv_freq.unique()))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(20, rows.shape[2], generator=gen)
    q = torch.einsum("hdk,tk->thd", rows, x)  # [T, H, dr]
    k = torch.randn(30, rows.shape[1], generator=gen)  # any key: only the queries need the structure
    qc, qs = cos_sin(torch.arange(20) + 7, inv_freq)
    kc, ks = cos_sin(torch.arange(30), inv_freq)
    q, k = apply_rope(q, qc, qs, interleaved), apply_rope(k, kc, ks, interleaved)
    want = torch.einsum("thd,sd->ths", q.double(), k.double())
    qg, kg = groups.queries(q), groups.keys(k)  # [T, H, 2F], [S, G, 2F]
    got = torch.einsum("thd,shd->ths", qg.double(), kg.double().repeat_interleave(3, 1))
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@native
@pytest.mark.parametrize("interleaved", [True, False])
@torch.inference_mode()
def test_a_folded_projection_gives_the_unmixed_query_and_mixes_back_to_the_shared_one(interleaved):
    rows, inv_freq = structured(k=25, interleaved=interleaved)  # [H, dr, K + 1]: the last column the bias
    groups = find(rows, inv_freq, interleaved)
    heads, dr, k = rows.shape[0], rows.shape[1], rows.shape[2] - 1
    gen = torch.Generator().manual_seed(5)
    nope, rest = 3, 7  # a nope part per head and rows after the query's (the packed projection's [c ; k_r])
    both = torch.cat(
        (
            torch.cat((torch.randn(heads, nope, k + 1, generator=gen), rows), dim=1).flatten(0, 1),
            torch.randn(rest, k + 1, generator=gen),
        )
    )
    weight, bias = both[:, :k], both[:, k]
    folded, folded_bias = groups.fold(weight, bias, nope)
    width = 2 * len(inv_freq.unique())
    assert folded.shape == (heads * (nope + width) + rest, k) and folded_bias.shape == (folded.shape[0],)
    x = torch.randn(20, k, generator=gen)
    full = (x @ weight.T + bias)[:, : heads * (nope + dr)].view(20, heads, nope + dr)
    short = x @ folded.T + folded_bias
    assert torch.equal(
        short[:, heads * (nope + width) :], (x @ weight.T + bias)[:, heads * (nope + dr) :]
    )  # the rest as it was
    short = short[:, : heads * (nope + width)].view(20, heads, nope + width)
    assert torch.allclose(short[..., :nope], full[..., :nope], atol=1e-5)
    cos, sin = cos_sin(torch.arange(20) + 11, inv_freq)
    rotated = apply_rope(full[..., nope:].contiguous(), cos, sin, interleaved)
    # un-mixed pair f turns at its frequency: the same as un-mixing the rotated shared query
    unmixed = apply_rope(short[..., nope:].contiguous(), cos[:, groups.slots], sin[:, groups.slots], True)
    assert (unmixed - groups.queries(rotated)).abs().max() <= 1e-5 * rotated.abs().max()
    assert (groups.mix(unmixed) - rotated).abs().max() <= 1e-5 * rotated.abs().max()


@pytest.mark.parametrize("case", ["random", "distinct frequencies", "heads out of order", "rank 2"])
def test_not_found_where_the_structure_does_not_hold(case):
    rows, inv_freq = structured()
    if case == "random":
        rows = torch.randn_like(rows)
    elif case == "distinct frequencies":  # DeepSeek's own: one slot a frequency, nothing to un-mix
        inv_freq = torch.arange(1, len(inv_freq) + 1).float().reciprocal()
    elif case == "heads out of order":
        rows = rows[[0, 3, 1, 4, 2, 5]]
    else:  # a refined conversion: off rank 1 by far more than float32 rounding
        rows = rows + 1e-4 * torch.randn(rows.shape, generator=torch.Generator().manual_seed(2))
    assert find(rows, inv_freq, True) is None


@pytest.fixture(scope="module")
def converted_gqa(tmp_path_factory):
    """The exact conversion of a tiny 2-KV-head Llama (its rope key 2 x head_dim wide)."""
    root = tmp_path_factory.mktemp("gqa")
    llama_tiny.save("llama_gqa", root / "src")
    windows = torch.randint(0, llama_tiny.VOCAB, (3, 48), generator=torch.Generator().manual_seed(2))
    src = read_source(root / "src")
    cfg, tensors, info = build_model(src, collect_stats(src, windows), ConvertOptions(rope_dim="all", kv_rank="full"))
    return export(root / "mla", src, cfg, tensors, info, {"rope_dim": "all", "kv_rank": "full"}), cfg


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_found_on_every_layer_of_an_exact_gqa_conversion(converted_gqa, dtype):
    out, cfg = converted_gqa
    model = load_model(out, dtype=dtype)
    first = model.model.layers[0].self_attn
    assert first.rope_groups() is None and first.scores_nope()  # under autograd: the reference ops
    for layer in model.model.layers:
        with torch.inference_mode():
            groups = layer.self_attn.rope_groups()
            # every key dimension is rotated: the format's dn = 2 nope dims are zero, left out of the scores
            assert not layer.self_attn.scores_nope()
            # the values per source KV head: the prefill expands one kv row per group
            per, expand = layer.self_attn.kv_groups()
            assert per == layer.spec.n_heads // 2 and expand.out_features == 2 * layer.spec.dv
        assert groups is not None and groups.groups == 2 and groups.basis.shape[2] == cfg["qk_rope_head_dim"] // 2


@native
@pytest.mark.parametrize("quantization", [None, "int8", "w4a8"])
def test_packed_query_projections_are_folded_before_they_quantize(converted_gqa, quantization):
    # batch-invariant linears pack the float weight (the engine's default route); quantized ones
    # quantize the folded rows, so their output is the un-mixed query too
    route = decide_route("cpu", torch.float32, quantization=quantization, batch_invariant=True)
    model = load_model(converted_gqa[0], route=route)
    with torch.inference_mode():
        for layer in model.model.layers:
            assert isinstance(layer.self_attn.q_linear(), QuantLinear) and layer.self_attn.q_linear().packed
            assert layer.self_attn.rope_groups() is not None
            # the projection packs the folded query rows (a head's rope part 2F wide, not dr)
            assert layer.self_attn.folded
            spec = layer.spec
            assert (
                layer.self_attn.q_linear().out_features
                == spec.n_heads * (spec.dn + spec.dr // 2) + spec.kv_rank + spec.dr
            )


@native
@pytest.mark.parametrize(
    "dtype,cache_dtype,quantization",
    [("float32", "auto", None), ("bfloat16", "int8_rope8", None), ("bfloat16", "int8_rope8", "w4a8")],
)
@torch.no_grad()
def test_the_decode_plan_gives_the_modules_bits_with_a_folded_projection(
    converted_gqa, dtype, cache_dtype, quantization
):
    route = decide_route("cpu", getattr(torch, dtype), "native", quantization, batch_invariant=quantization is None)
    model = load_model(converted_gqa[0], route=route)
    assert all(layer.self_attn.folded for layer in model.model.layers)
    caches = random_caches(model, cache_dtype, 24)
    plan, reason = decode_plan.build(model, caches)
    assert plan is not None, reason
    assert_plan_gives_the_modules_bits(model, plan, caches, 4, True)


@torch.inference_mode()
def test_deepseek_checkpoints_keep_their_nope_part_and_shared_key(tiny_checkpoints):
    model = load_model(tiny_checkpoints("v3_dense_qlora")[0])
    assert all(
        layer.self_attn.scores_nope()
        and layer.self_attn.rope_groups() is None
        and layer.self_attn.kv_groups() == (1, None)
        for layer in model.model.layers
    )


@native
def test_prefill_with_groups_matches_the_shared_key_and_is_chunk_invariant(converted_gqa, monkeypatch):
    out, _ = converted_gqa
    prompt = torch.randint(2, llama_tiny.VOCAB, (150,), generator=torch.Generator().manual_seed(3)).tolist()
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=1)

    def run(dtype, chunk=None):
        llm = LLM(
            model=str(out),
            dtype=dtype,
            skip_tokenizer_init=True,
            kv_cache_dtype="auto",
            max_num_batched_tokens=chunk,
            kv_cache_memory="64MiB",
        )
        result = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        return list(result.outputs[0].token_ids), [
            max(x.logprob for x in p.values()) if p else None for p in result.prompt_logprobs
        ]

    for dtype in ("float32", "bfloat16"):
        assert run(dtype) == run(dtype, chunk=64)  # chunks of 64 after cached context: the same bits
    tokens, logprobs = run("float32")
    # the shared key, with its nope part, from the query projection as the checkpoint has it
    monkeypatch.setattr(MLAttention, "_keep_rope_groups", lambda self, weight, bias: None)
    monkeypatch.setattr(MLAttention, "rope_groups", lambda self: None)
    monkeypatch.setattr(MLAttention, "scores_nope", lambda self: True)
    monkeypatch.setattr(MLAttention, "kv_groups", lambda self: (1, None))
    shared_tokens, shared = run("float32")
    assert tokens == shared_tokens
    assert max(abs(a - b) for a, b in zip(logprobs[1:], shared[1:])) <= 1e-4
