"""model/route.py: the route is decided once, from the dtype, the weights, batch invariance and what
the native extensions built (their switches included), and the model is built from it: the linear
classes, the fused ops, W_UK / W_UV's storage — nothing is swapped in after loading."""

import pytest
import torch
from torch import nn

from latentkv.config import ModelConfig
from latentkv.kernels import decode_ops, qlinear
from latentkv.model.deepseek import MLP
from latentkv.model.loader import empty_model, load_model
from latentkv.model.mla import MLAttention
from latentkv.model.norm import RMSNorm
from latentkv.model.packed import PackedLinear
from latentkv.model.quant import FixedOrderLinear, Int8Linear, W8A8Linear
from latentkv.model.route import decide_route

SWITCHES = {"LATENTKV_QLINEAR": qlinear, "LATENTKV_FUSED": decode_ops}


def switch_off(monkeypatch, switch):
    """The extension as a process started with `switch`=0 sees it."""
    monkeypatch.setattr(SWITCHES[switch].EXT, "state", {})
    monkeypatch.setenv(switch, "0")
    assert not SWITCHES[switch].available()


def linears(model) -> dict[str, nn.Module]:
    """Every linear but kv_b_proj (the absorbed path reads its weight: always torch's), by name."""
    kinds = (nn.Linear, FixedOrderLinear, Int8Linear, W8A8Linear)
    return {n: m for n, m in model.named_modules() if isinstance(m, kinds) and not n.endswith("kv_b_proj")}


# dtype, quantization, batch invariance, a switch set to 0 -> the class every linear is built as
# (None: torch's), whether it needs the qlinear kernel to be that
CASES = [
    ("float32", None, False, None, None),
    ("float32", None, True, None, FixedOrderLinear),
    ("bfloat16", None, True, None, FixedOrderLinear),
    ("float32", None, True, "LATENTKV_QLINEAR", None),  # no kernel: torch's linears (padded by the engine)
    ("float32", "int8", False, None, Int8Linear),
    ("float32", "w8a8", False, None, W8A8Linear),
    ("float32", None, True, "LATENTKV_FUSED", FixedOrderLinear),
]


@pytest.mark.parametrize("dtype,quantization,invariant,switch,cls", CASES)
@torch.inference_mode()
def test_the_model_is_built_as_the_route_says(
    tiny_checkpoints, monkeypatch, dtype, quantization, invariant, switch, cls
):
    needs = {FixedOrderLinear: qlinear, W8A8Linear: qlinear, Int8Linear: None, None: None}[cls]
    if needs is not None and not needs.available():
        pytest.skip(f"{needs.EXT.family} not built: {needs.unavailable_reason()}")
    if switch:
        switch_off(monkeypatch, switch)
    folder, _ = tiny_checkpoints("v3_moe_sigmoid")  # MoE experts, q_lora: every kind of linear
    route = decide_route("cpu", getattr(torch, dtype), "auto", quantization, invariant)
    model = load_model(folder, route=route)
    assert model.route is route
    built = linears(model)
    # 3 layers' qkv_a, q_b, o; layer 0's MLP (gate_up, down); 2 MoE layers' 8 + 1 experts; lm_head
    assert len(built) == 3 * 3 + 2 + 2 * (8 + 1) * 2 + 1
    assert all(type(m) in ((cls,) if cls else (nn.Linear, PackedLinear)) for m in built.values())
    if cls is FixedOrderLinear:
        assert {m.bits for m in built.values()} == {16 if dtype == "bfloat16" else 32}
    if cls is Int8Linear:
        assert all(m.uses_qlinear == qlinear.available() for m in built.values())
    assert all(type(layer.self_attn.kv_b_proj) is nn.Linear for layer in model.model.layers)
    fused = decode_ops.available()  # False under LATENTKV_FUSED=0
    assert route.fused == fused and all(m.kernel == fused for m in model.modules() if isinstance(m, RMSNorm))
    assert all(m.fused == fused for m in model.modules() if isinstance(m, (MLAttention, MLP)))


@torch.inference_mode()
def test_loading_swaps_no_module(tiny_checkpoints):
    """The classes of the loaded model are the ones it was constructed with (the loader fills and
    packs weights; it replaces no child)."""
    folder, _ = tiny_checkpoints("v2_dense")
    route = decide_route("cpu", torch.float32, "auto", "int8")
    constructed = empty_model(ModelConfig.from_file(folder / "config.json"), route, "meta")
    loaded = load_model(folder, route=route)
    assert {n: type(m) for n, m in constructed.named_modules()} == {n: type(m) for n, m in loaded.named_modules()}


@torch.inference_mode()
def test_beside_quantized_linears_kv_b_proj_is_on_the_bf16_grid(tiny_checkpoints):
    """W_UK / W_UV are stored in bf16 for the absorbed path, so kv_b_proj's values are rounded to
    bf16 when loaded (both paths then use the same weights); a float route keeps them exact."""
    folder, _ = tiny_checkpoints("v2_dense")
    plain = load_model(folder).model.layers[0].self_attn
    quantized = load_model(folder, quantization="int8").model.layers[0].self_attn
    assert plain.absorbed_dtype is None and quantized.absorbed_dtype == torch.bfloat16
    w = plain.kv_b_proj.weight
    assert not torch.equal(w, w.bfloat16().float())  # the tiny checkpoint's float32 values are not on the grid
    assert torch.equal(quantized.kv_b_proj.weight, w.bfloat16().float())
    w_uk, _ = quantized.split_kv_b()
    assert w_uk.dtype == torch.bfloat16


def test_the_route_asks_only_the_extensions_it_can_use():
    """A float model on the CPU asks the attention and fused-op extensions, not qlinear; float16 or
    another device runs none of the CPU kernels."""
    assert [family for family, _ in decide_route("cpu", torch.float32).isas] == ["attention", "decode_ops"]
    assert [family for family, _ in decide_route("cpu", torch.float32, "torch", "int8").isas] == [
        "decode_ops",
        "qlinear",
    ]
    for route in (decide_route("cpu", torch.float16, "torch"), decide_route("cuda", torch.float32, "torch")):
        assert route.isas == () and not route.fused and not route.qlinear and route.weights == "float"


@pytest.mark.parametrize("quantization", ["int4", "w4a8", "w8a8"])
def test_cpu_only_quantizations_are_refused_elsewhere(quantization):
    with pytest.raises(ValueError, match=f"quantization '{quantization}' has CPU kernels only"):
        decide_route("cuda", torch.float16, "torch", quantization)
