"""A MoE layer's experts in one native call (kernels/qlinear.py `moe`, csrc/qlinear/moe.h) against
model/deepseek.py moe_reference (the per-expert loop over the same modules), and MoE.forward's choice
between them.

No tolerance: the op runs each expert's linears through the packed kernels the modules run (a row's
bits do not depend on the rows beside it: tests/model/test_qlinear.py), SwiGLU through the rows
decode_ops' silu_mul runs (common/swiglu_rows.h) on the same ISA, and sums a token's slots in the
reference's order with the reference's roundings (a float32 product, then a float32 sum, per slot;
the shared experts last). So for every record kind, float32 and bf16 activations and every ISA the
two agree bit for bit (the integer-dot kinds on avx512 and above: the VNNI path where the CPU has
avx512_vnni, qlinear.dot_path), and a token's row is the same alone, in any batch and on any thread
count."""

import pytest
import torch

from latentkv.config import ModelConfig
from latentkv.kernels import decode_ops, qlinear
from latentkv.model.deepseek import Gate, MoE, moe_reference
from latentkv.model.route import decide_route
from threads import torch_threads

pytestmark = pytest.mark.skipif(not qlinear.available(), reason=f"qlinear not built: {qlinear.unavailable_reason()}")

E, D, INTER, SHARED = 8, 96, 40, 2  # 8 routed experts of width 40 (not whole groups of 32), 2 shared ones
# widths: 40 (groups padded; SwiGLU after gate_up) and 64 (whole groups: on AMX the SwiGLU in gate_up's
# last step and down reading its output in place)
INTERS = [INTER, 64]
# (dtype, weights): every record kind (32, 16, 4, 8, 104, 108, 114) and bf16 activations on quantized weights
WEIGHTS = [
    ("float32", "fixed-order"),
    ("bfloat16", "fixed-order"),
    ("float32", "int4"),
    ("float32", "int8"),
    ("float32", "w4a8"),
    ("float32", "w8a8"),
    ("bfloat16", "int4"),
    ("bfloat16", "w8a8"),
    ("bfloat16", "w4a8_g128"),
]
RECORDS = {"int4": 4, "int8": 8, "w4a8": qlinear.ACT8 + 4, "w8a8": qlinear.ACT8 + 8, "w4a8_g128": qlinear.W4A8_G128}


def config(k: int = 6, inter: int = INTER, **changes) -> ModelConfig:
    return ModelConfig.from_dict(
        dict(
            model_type="deepseek_v2",
            vocab_size=128,
            hidden_size=D,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=12,
            moe_intermediate_size=inter,
            n_routed_experts=E,
            n_shared_experts=SHARED,
            num_experts_per_tok=k,
            first_k_dense_replace=1,
        )
        | changes
    )


@torch.no_grad()
def moe_layer(dtype: str, weights: str, k: int = 6, seed: int = 0, inter: int = INTER) -> MoE:
    """A MoE layer built as the route builds it, random weights, packed as the loader leaves it."""
    quantization = None if weights == "fixed-order" else weights
    route = decide_route("cpu", getattr(torch, dtype), "torch", quantization, batch_invariant=quantization is None)
    layer = MoE(config(k, inter), route).to(getattr(torch, dtype))
    gen = torch.Generator().manual_seed(seed)
    for p in layer.parameters():
        p.copy_((torch.randn(p.shape, generator=gen) * 0.1).to(p.dtype))
    layer.pack_weights()
    return layer


_LAYERS: dict = {}


def cached_layer(dtype: str, weights: str, inter: int = INTER) -> MoE:
    if (dtype, weights, inter) not in _LAYERS:
        _LAYERS[dtype, weights, inter] = moe_layer(dtype, weights, inter=inter)
    return _LAYERS[dtype, weights, inter]


def routing(tokens: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> weights [T, k] float32, ids [T, k]: distinct experts per token as topk gives them, expert 0
    in every token (in a random slot), expert E - 1 in none."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack(
        [
            torch.cat((torch.zeros(1, dtype=torch.long), torch.randperm(E - 2, generator=gen)[: k - 1] + 1))[
                torch.randperm(k, generator=gen)
            ]
            for _ in range(tokens)
        ]
    )
    return torch.rand(tokens, k, generator=gen) + 0.05, ids


def native(layer: MoE, x, weights, ids) -> torch.Tensor:
    return qlinear.moe(x, weights, ids, *layer.native)


def use_isa(name: str, monkeypatch) -> None:
    """qlinear on path `name`, decode_ops (the reference's SwiGLU) under the same capabilities (its silu_mul
    takes the rows the op's SwiGLU takes)."""
    monkeypatch.setitem(qlinear.EXT.state, "caps", qlinear.EXT.path_caps(name))
    monkeypatch.setitem(decode_ops.EXT.state, "caps", qlinear.EXT.path_caps(name))


@pytest.fixture(autouse=True)
def need_fused_ops():
    if not decode_ops.available():  # the reference's SwiGLU must be the native rows for equal bits
        pytest.skip(f"fused ops not built: {decode_ops.unavailable_reason()}")


@pytest.mark.parametrize("dtype,weights", WEIGHTS)
@pytest.mark.parametrize("tokens", [1, 3, 32, 67])  # direct (M < 4) and tile passes inside the groups
@pytest.mark.parametrize("k", [1, 6])
@pytest.mark.parametrize("inter", INTERS)
@torch.no_grad()
def test_native_call_gives_the_reference_bits(dtype, weights, tokens, k, inter, monkeypatch):
    layer = cached_layer(dtype, weights, inter)
    assert layer.native is not None and layer.native[4] == RECORDS.get(weights, 16 if dtype == "bfloat16" else 32)
    x = torch.randn(tokens, D, generator=torch.Generator().manual_seed(tokens)).to(getattr(torch, dtype))
    w, ids = routing(tokens, k, seed=tokens + k)
    for isa in qlinear.EXT.supported_isas():
        use_isa(isa, monkeypatch)
        out = native(layer, x, w, ids)
        assert out.shape == x.shape and out.dtype == x.dtype
        assert torch.equal(out, moe_reference(x, w, ids, layer.experts, layer.shared_experts)), isa


@pytest.mark.parametrize("dtype,weights", WEIGHTS)
@pytest.mark.parametrize("inter", INTERS)
@torch.no_grad()
def test_a_token_has_the_same_bits_alone_in_a_batch_and_on_any_threads(dtype, weights, inter):
    """33 tokens (each in 6 of the experts): every token's row computed alone on 1 thread equals its
    row in the batch on 2 threads (and the batch on 1 thread), on the ISA that serves."""
    layer = cached_layer(dtype, weights, inter)
    x = torch.randn(33, D, generator=torch.Generator().manual_seed(5)).to(getattr(torch, dtype))
    w, ids = routing(33, 6, seed=6)
    with torch_threads(2):
        batch = native(layer, x, w, ids)
    with torch_threads(1):
        assert torch.equal(native(layer, x, w, ids), batch)
        for t in range(33):
            assert torch.equal(native(layer, x[t : t + 1], w[t : t + 1], ids[t : t + 1]), batch[t : t + 1]), t
    with torch_threads(2):
        assert torch.equal(native(layer, x[7:8], w[7:8], ids[7:8]), batch[7:8])


@torch.no_grad()
def test_forward_runs_the_native_call_where_the_route_packs_for_qlinear(monkeypatch):
    """Packed linears: MoE.forward is the router then the native call, and the experts' buffers are
    views of the stacked records (no second copy). Under autograd, torch's linears, or ATen's int
    kernels (qlinear not built), the reference runs."""
    layer = moe_layer("float32", "int4")
    stack = layer.native[0]
    assert all(
        mlp.gate_up_proj.weight_packed.untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()
        for mlp in layer.experts
    )
    x = torch.randn(9, D, generator=torch.Generator().manual_seed(1))
    weights, ids = layer.gate(x)
    assert torch.equal(layer(x), native(layer, x, weights, ids))
    calls = []
    monkeypatch.setattr(qlinear, "moe", lambda *args: calls.append(args))
    with torch.enable_grad():  # (the SwiGLU there is PyTorch's too: fused.runs; the router torch's sgemm)
        weights, ids = layer.gate(x)
        assert torch.equal(layer(x), moe_reference(x, weights, ids, layer.experts, layer.shared_experts))
    assert not calls
    route = decide_route("cpu", torch.float32, "torch")  # torch's linears
    float_layer = MoE(config(), route)
    float_layer.pack_weights()
    assert route.weights == "float" and float_layer.native is None
    monkeypatch.setitem(qlinear.EXT.state, "module", None)
    monkeypatch.setitem(qlinear.EXT.state, "reason", "test")
    aten = moe_layer("float32", "int4")
    assert not aten.experts[0].gate_up_proj.uses_qlinear and aten.native is None
    aten(x)
    assert not calls


@torch.no_grad()
def test_bad_input_is_an_error_naming_it():
    layer = cached_layer("float32", "int8")
    x = torch.randn(4, D)
    w, ids = routing(4, 6, seed=2)
    with pytest.raises(RuntimeError, match=r"ids\[2, 3\] = 8 is not one of the 8 experts"):
        ids_bad = ids.clone()
        ids_bad[2, 3] = E
        native(layer, x, w, ids_bad)
    with pytest.raises(RuntimeError, match="ids must be \\[T, k\\] int64"):
        native(layer, x, w, ids.int())
    with pytest.raises(RuntimeError, match="weights must be \\[T, k\\] float32"):
        native(layer, x, w[:, :3], ids)
    gate_up, down, shared_gate_up, shared_down, kind, inter, shared_inter = layer.native
    with pytest.raises(RuntimeError, match="moe down .* does not fit 40 inputs and 96 outputs"):
        qlinear.moe(x, w, ids, gate_up, gate_up, shared_gate_up, shared_down, kind, inter, shared_inter)
    with pytest.raises(RuntimeError, match="moe gate_up .* does not fit 60 inputs"):
        qlinear.moe(x[:, :60], w, ids, gate_up, down, shared_gate_up, shared_down, kind, inter, shared_inter)


@pytest.mark.parametrize("experts,hidden", [(64, 2048), (8, D)])  # DeepSeek-V2-Lite's router; this file's
@torch.no_grad()
def test_router_logits_of_a_token_do_not_depend_on_the_batch(experts, hidden):
    """Gate.logits runs latentkv's fixed-order kernel: MKL's sgemm rounded rows of K = 2048, E = 64 by M
    on the AMX Xeon even padded to 12 rows, which can flip an expert choice between alone and batched."""
    gate = Gate(config(hidden_size=hidden, n_routed_experts=experts))
    gen = torch.Generator().manual_seed(0)
    gate.weight.copy_(torch.randn(experts, hidden, generator=gen) * hidden**-0.5)
    x = torch.randn(40, hidden, generator=gen).to(torch.bfloat16)
    full = gate.logits(x)
    assert gate.packed() is not None
    for m in range(1, 17):
        assert torch.equal(gate.logits(x[3 : 3 + m]), full[3 : 3 + m]), m
    assert torch.allclose(full, x.float() @ gate.weight.T, atol=1e-4)


ROUTERS = {  # DeepSeek-V2 (softmax, greedy or group-limited greedy) and V3 (sigmoid, noaux_tc, groups, normalized)
    "v2": dict(scoring_func="softmax", topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False),
    "v2-groups": dict(
        scoring_func="softmax",
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=2,
        norm_topk_prob=False,
        routed_scaling_factor=16.0,
    ),
    "v3": dict(
        model_type="deepseek_v3",
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
    ),
}


@pytest.mark.parametrize("router", ROUTERS)
def test_native_route_picks_what_the_torch_route_picks(router):
    """qlinear.moe_route (Gate.forward's native pass, the decode plan's too) against Gate.route, the same
    steps in torch ops: the same experts in the same order, the weights within float rounding; a token's
    row the same alone as in the batch."""
    cfg = config(k=3, n_routed_experts=16, **ROUTERS[router])
    gate = Gate(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if gate.e_score_correction_bias is not None:
            gate.e_score_correction_bias.copy_(torch.randn(16, generator=gen) * 0.1)
    logits = torch.randn(200, 16, generator=gen) * 2
    bias = gate.e_score_correction_bias

    def native(rows):
        return qlinear.moe_route(
            rows,
            bias,
            gate.softmax,
            cfg.n_group,
            cfg.topk_group,
            gate.noaux,
            gate.group_limited,
            cfg.num_experts_per_tok,
            gate.normalized,
            float(cfg.routed_scaling_factor),
        )

    with torch.no_grad():
        weights, ids = native(logits)
        want_w, want_ids = gate.route(logits)
    assert torch.equal(ids, want_ids)
    assert torch.allclose(weights, want_w, rtol=1e-5, atol=1e-7)
    for t in (0, 57, 199):
        w1, i1 = native(logits[t : t + 1])
        assert torch.equal(i1[0], ids[t]) and torch.equal(w1[0], weights[t])


def test_gate_forward_runs_the_native_route_and_grad_the_torch_one():
    cfg = config(k=3, n_routed_experts=16, **ROUTERS["v3"])
    gate = Gate(cfg)
    with torch.no_grad():
        gate.weight.copy_(torch.randn(16, D, generator=torch.Generator().manual_seed(2)))
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        w_native, ids_native = gate(x)
    w_grad, ids_grad = gate(x)  # autograd on: the torch route
    assert torch.equal(ids_native, ids_grad) and torch.allclose(w_native, w_grad.detach(), rtol=1e-5)
    assert w_grad.requires_grad
