"""The decode plan (model/decode_plan.py) gives the modules' bits: the same kernels, arguments and
order, without the Python between them."""

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from latentkv import LLM, SamplingParams
from latentkv.attention.metadata import build_metadata
from latentkv.cache import transform_code as tc
from latentkv.cache.latent_cache import allocate_caches
from latentkv.kernels import attention as attention_kernels, decode_ops, qlinear
from latentkv.model import decode_plan
from latentkv.model.loader import load_model
from latentkv.model.route import decide_route

BLOCK = 4


@pytest.fixture(autouse=True)
def need_extensions():
    for name, module in (("fused ops", decode_ops), ("qlinear", qlinear), ("attention kernel", attention_kernels)):
        if not module.available():
            pytest.skip(f"{name} not built: {module.unavailable_reason()}")


def variant(folder, out, latent_norm, bias):
    """The tiny checkpoint as converted models store it: without kv_a_layernorm (latent_norm False),
    with a q_proj bias (bias: Qwen2 sources), said in config.json's latentkv extensions."""
    if latent_norm and not bias:
        return folder
    raw = json.loads((folder / "config.json").read_text())
    raw["latentkv"] = {"version": 1, "kv_a_layernorm": latent_norm, "q_bias": bias}
    tensors = {
        k: v for k, v in load_file(folder / "model.safetensors").items() if latent_norm or "kv_a_layernorm" not in k
    }
    gen = torch.Generator().manual_seed(7)
    width = raw["num_attention_heads"] * (raw["qk_nope_head_dim"] + raw["qk_rope_head_dim"])
    for i in range(raw["num_hidden_layers"] if bias else 0):
        tensors[f"model.layers.{i}.self_attn.q_proj.bias"] = torch.randn(width, generator=gen)
    out.mkdir()
    (out / "config.json").write_text(json.dumps(raw))
    save_file(tensors, out / "model.safetensors")
    return out


def model_for(folder, dtype, weights, latent_norm=True, bias=False, tmp_path=None):
    """The model as the engine builds it: fixed-order linears (batch invariance) or quantized ones."""
    folder = variant(folder, tmp_path / "variant", latent_norm, bias) if tmp_path else folder
    fixed = weights == "fixed-order"
    route = decide_route("cpu", getattr(torch, dtype), "native", None if fixed else weights, batch_invariant=fixed)
    return load_model(str(folder), route=route)


def coded_variant(folder, out):
    """The tiny checkpoint with a centred transform code of 0-8 bits a direction, layers apart, in its
    config (latentkv.cache_format: the engine serves the folder in that format)."""
    raw = json.loads((folder / "config.json").read_text())
    rng = random.Random(1)
    layers, r, dr = raw["num_hidden_layers"], raw["kv_lora_rank"], raw["qk_rope_head_dim"]
    bits = ([[rng.choice((0, 3, 4, 8)) for _ in range(n)] for _ in range(layers)] for n in (r, dr))
    code = tc.TransformCode(*(tuple(map(tuple, side)) for side in bits), 8)
    means = ([[rng.uniform(-0.2, 0.2) for _ in range(n)] for _ in range(layers)] for n in (r, dr))
    raw["latentkv"] = {"version": 1, "cache_format": code.centred(*means).to_dict()}
    out.mkdir()
    (out / "config.json").write_text(json.dumps(raw))
    (out / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    return out


def random_caches(model, cache_dtype, blocks):
    caches = allocate_caches(model.config, blocks, BLOCK, model.dtype, cache_dtype, "cpu")
    gen = torch.Generator().manual_seed(3)
    for cache in caches:
        if cache.format.coded:  # codes of every width and positive float16 scales
            cache.latent.copy_(torch.randint(0, 256, cache.latent.shape, generator=gen, dtype=torch.uint8))
            cache.scale.copy_((torch.rand(cache.scale.shape, generator=gen) * 0.5 + 0.05).half())
        elif cache.quantized:
            cache.latent.copy_(torch.randint(-127, 128, cache.latent.shape, generator=gen, dtype=torch.int8))
            cache.scale.copy_(torch.rand(cache.scale.shape, generator=gen) * 0.02 + 0.001)
            cache.rope.copy_(torch.randn(cache.rope.shape, generator=gen).to(cache.rope.dtype))
        else:
            cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen).to(cache.kv.dtype))
    return caches


def cache_tensors(caches):
    return [t.clone() for c in caches for t in c.tensors()]


@pytest.mark.parametrize(
    "name,dtype,weights,cache_dtype,latent_norm,bias",
    [
        ("v2_dense", "float32", "fixed-order", "auto", True, False),
        ("v2_dense", "float32", "int4", "int8", False, True),
        ("v3_dense_qlora", "float32", "int8", "auto", True, False),
        ("v3_dense_qlora", "float32", "int4", "fp8_e4m3", True, False),
        ("v3_yarn_halves_tied", "float32", "fixed-order", "int8", False, False),
        ("v2_dense", "float32", "w4a8", "int8", False, True),
        ("v3_dense_qlora", "float32", "w8a8", "auto", True, False),
        # bf16 records (vdpbf16ps where the CPU has it)
        ("v3_dense_qlora", "bfloat16", "fixed-order", "auto", True, False),
        ("v2_dense", "bfloat16", "fixed-order", "int8", False, True),
        ("v2_dense", "bfloat16", "w4a8", "int8", True, False),
        ("v2_dense", "float32", "int4", "int8_rope8", False, True),  # the rope key in int8 too
        ("v3_dense_qlora", "bfloat16", "fixed-order", "fp8_e4m3_rope8", True, False),
        # MoE layers (the first layer dense): the router's native pass and the experts' native call (qlinear)
        ("v2_moe_group_limited", "float32", "int4", "auto", True, False),
        ("v3_moe_sigmoid", "float32", "fixed-order", "int8", True, False),
        ("v2_lite_moe", "float32", "w4a8", "auto", False, False),
        ("v3_lite_moe", "bfloat16", "fixed-order", "auto", True, False),
        ("v3_lite_moe", "float32", "int8", "auto", True, False),
        ("v3_lite_moe", "bfloat16", "w4a8_g128", "int8", True, False),  # groups of 128 (kind 114)
    ],
)
@pytest.mark.parametrize("invariant_meta", [True, False])
@torch.no_grad()
def test_plan_gives_the_modules_bits(
    tiny_checkpoints, tmp_path, name, dtype, weights, cache_dtype, latent_norm, bias, invariant_meta
):
    folder, _ = tiny_checkpoints(name)
    model = model_for(folder, dtype, weights, latent_norm, bias, tmp_path)
    assert all(layer.self_attn.kv_a_layernorm is None for layer in model.model.layers) != latent_norm
    assert (model.model.layers[0].self_attn.qkv_a_proj.bias is not None) == bias
    caches = random_caches(model, cache_dtype, 24)
    plan, reason = decode_plan.build(model, caches)
    assert plan is not None, reason
    # one description of each layer: the spec its modules were built from is the one the plan read
    assert all(spec is layer.spec is layer.self_attn.spec for spec, layer in zip(plan.specs, model.model.layers))
    # 4 rows; and 3 in MoE models (the router's float32 linear pads them to 4: invariant.linear)
    for rows in (4, 3) if any(layer.spec.moe for layer in model.model.layers) else (4,):
        assert_plan_gives_the_modules_bits(model, plan, caches, rows, invariant_meta)


def assert_plan_gives_the_modules_bits(model, plan, caches, rows, invariant_meta):
    contexts = [5, 17, 2, 33][:rows]  # ending mid-block; one sequence's blocks out of order below
    tables = [[0, 1], [2, 3, 4, 5, 6], [7], [20, 8, 9, 10, 11, 12, 13, 14, 15]][:rows]
    meta, positions = build_metadata([1] * rows, contexts, tables, BLOCK, invariant=invariant_meta)
    assert plan.applies(meta)
    ids = torch.tensor([3, 77, 12, 101][:rows]) % model.config.vocab_size
    before = cache_tensors(caches)
    by_modules = model(ids, positions, meta, caches)
    after_modules = cache_tensors(caches)
    for saved, cache_t in zip(before, [t for c in caches for t in c.tensors()]):
        cache_t.copy_(saved)
    by_plan = plan(ids, positions, meta)
    assert torch.equal(by_plan, by_modules), rows
    assert all(torch.equal(a, b) for a, b in zip(cache_tensors(caches), after_modules))  # the same latents written


@pytest.mark.parametrize(
    "name,dtype,weights",
    [
        ("v2_dense", "float32", "fixed-order"),
        ("v3_dense_qlora", "bfloat16", "fixed-order"),
        ("v2_dense", "bfloat16", "w4a8"),
    ],
)
@pytest.mark.parametrize("invariant_meta", [True, False])
@torch.no_grad()
def test_plan_gives_the_modules_bits_over_a_transform_coded_cache(
    tiny_checkpoints, tmp_path, name, dtype, weights, invariant_meta
):
    """A folder that records a transform code: the plan writes each token's codes with the layers' writer
    (decode_ops coded_write) and reads them with the query and output maps around mla_decode_coded, as
    the modules do (attention/native_backend.py CodedBackend): the same codes, scales and output bits."""
    folder, _ = tiny_checkpoints(name)
    model = model_for(coded_variant(folder, tmp_path / "coded"), dtype, weights)
    caches = random_caches(model, "transform_code", 24)
    assert all(cache.format.coded for cache in caches)
    plan, reason = decode_plan.build(model, caches)
    assert plan is not None, reason
    assert len(plan.cs_views) == 1  # the layers share their RoPE: one cos / sin table a step
    for rows in (4, 3):
        assert_plan_gives_the_modules_bits(model, plan, caches, rows, invariant_meta)


def test_the_plan_checks_the_type_of_each_kernel_it_calls():
    """decode_step.cpp calls qlinear's linear, swiglu_linear, moe and moe_route and attention's mla_decode
    and mla_decode_coded through capsules of the types kernels/csrc/common/kernel_fns.h declares (each named
    by its type): one of another type is refused when the plan is built, never called."""
    ext = qlinear.extension()
    fns = {
        "qlinear's linear": ext.linear_capsule,
        "qlinear's swiglu_linear": ext.swiglu_capsule,
        "qlinear's moe": ext.moe_capsule,
        "qlinear's moe_route": ext.route_capsule,
        "attention's mla_decode": attention_kernels.extension().mla_decode_capsule,
        "attention's mla_decode_coded": attention_kernels.extension().mla_decode_coded_capsule,
    }
    step, norm = decode_ops.extension().DecodePlan, torch.ones(8)
    step([], norm, 1e-6, *fns.values(), 0, 0, 0)
    names = list(fns)
    for i, what in enumerate(names):
        wrong = list(fns.values())
        wrong[i] = fns[names[i - 1]]  # its neighbour's capsule, of another type
        with pytest.raises(RuntimeError, match=f"the capsule for {what} holds latentkv:.* this extension calls"):
            step([], norm, 1e-6, *wrong, 0, 0, 0)


class RecordPlan:
    """decode_ops' plan classes as keyword records (what mlp_entry hands decode_step.cpp)."""

    def PlanLinear(self, **fields):  # noqa: N802 - the extension's class name
        return fields


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_dense_mlp_runs_its_swiglu_in_the_plan_where_the_module_does(tiny_checkpoints, dtype):
    """MLP.forward takes qlinear's swiglu_linear for bf16 rows on AMX (I % 16 == 0); the plan is handed
    the same choice (decode_step.cpp then calls the swiglu capsule: the same bits, test above)."""
    folder, _ = tiny_checkpoints("v3_dense_qlora")
    model = model_for(folder, dtype, "fixed-order")
    mlp = model.model.layers[0].mlp
    entry = decode_plan.mlp_entry(RecordPlan(), mlp, False, getattr(torch, dtype))
    runs = dtype == "bfloat16" and qlinear.fused_swiglu(16, mlp.gate_up_proj.out_features // 2)
    assert entry["gate_up"]["swiglu"] == runs and not entry["down"]["swiglu"]
    assert mlp.gate_up_proj.swiglu_runs(getattr(torch, dtype)) == runs


@torch.inference_mode()
def test_plan_applies_to_all_decode_steps_only(tiny_checkpoints):
    folder, _ = tiny_checkpoints("v2_dense")
    model = model_for(folder, "float32", "int4")
    caches = random_caches(model, "auto", 8)
    plan, _ = decode_plan.build(model, caches)
    prefill, _ = build_metadata([3], [3], [[0]], BLOCK, invariant=True)
    mixed, _ = build_metadata([1, 3], [4, 3], [[0], [1]], BLOCK, invariant=True)
    first_token, _ = build_metadata([1], [1], [[0]], BLOCK)  # a one-token prompt: the naive path is cheaper
    assert not plan.applies(prefill) and not plan.applies(mixed) and not plan.applies(first_token)


def test_build_says_why_not(tiny_checkpoints):
    folder, _ = tiny_checkpoints("v2_moe_group_limited")
    model = model_for(folder, "float32", "int4")
    model.model.layers[2].mlp.native = None  # as if its experts could not run the native call
    caches = allocate_caches(model.config, 4, BLOCK, model.dtype, "auto", "cpu")
    plan, reason = decode_plan.build(model, caches)
    assert plan is None and reason == "layer 2: MoE experts without their native call"
    folder, _ = tiny_checkpoints("v2_dense")
    dense = load_model(str(folder), "float32", "cpu", "native")  # plain nn.Linear: MKL, not the packed kernel
    plan, reason = decode_plan.build(dense, allocate_caches(dense.config, 4, BLOCK, dense.dtype, "auto", "cpu"))
    assert plan is None and "packed kernel" in reason


@pytest.mark.parametrize(
    "name,quantization,dtype",
    [
        ("v2_dense", None, "float32"),
        ("v2_dense", "int4", "float32"),
        ("v2_dense", None, "bfloat16"),
        ("v2_lite_moe", "int4", "float32"),
        ("v3_lite_moe", None, "bfloat16"),
    ],
)
def test_engine_replays_the_plan_and_enforce_eager_turns_it_off(tiny_checkpoints, name, quantization, dtype):
    """End to end: the engine's own model decodes through the plan; with enforce_eager through the
    modules; the same tokens and logprobs, exactly."""
    folder, _ = tiny_checkpoints(name)
    prompts = [[5, 9, 33, 2, 7], [11] * 19, [40, 41, 42]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)

    def run(**kw):
        llm = LLM(
            str(folder),
            dtype=dtype,
            quantization=quantization,
            block_size=4,
            kv_cache_memory="2MiB",
            skip_tokenizer_init=True,
            **kw,
        )
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return llm, [(list(o.outputs[0].token_ids), o.outputs[0].logprobs) for o in outs]

    planned, with_plan = run()
    eager, without = run(enforce_eager=True)
    assert planned.engine.runner.plan is not None and eager.engine.runner.plan is None
    assert with_plan == without
