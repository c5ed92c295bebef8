"""Weight-only int8 linears: the kernel and its fallback agree with dequantized weights,
and a quantized model stays close to the float one."""

import pytest
import torch
from torch import nn

from latentkv.kernels import qlinear
from latentkv.model import quant
from latentkv.model.loader import load_model
from latentkv.model.quant import Int4Linear, Int8Linear, dequantize_int4, quantize_int4, quantize_int8


@pytest.mark.parametrize("in_features", [64, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_matches_dequantized_weights(in_features, dtype):
    torch.manual_seed(0)
    linear = nn.Linear(in_features, 48, bias=True).to(dtype)
    q = Int8Linear.from_linear(linear, qlinear.available())
    x = torch.randn(5, in_features, dtype=dtype)
    codes, _ = quantize_int8(linear.weight)
    dequant = codes.float() * q.scales.float()[:, None]
    ref = x.float() @ dequant.T + linear.bias.float()
    assert (q(x).float() - ref).abs().max().item() <= 0.02 * ref.abs().max().item()
    # half a step; in bf16 the stored scale itself is rounded (half an ulp: relative 2^-8, times up to 127 steps)
    step = q.scales.float().max()
    bound = step / 2 + (127 * step * 2**-8 if dtype == torch.bfloat16 else 0) + 1e-6
    assert (dequant - linear.weight.float()).abs().max() <= bound


@torch.inference_mode()
def test_quantized_model_stays_close(tiny_checkpoints):
    folder, _ = tiny_checkpoints("v3_moe_sigmoid")
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    ref = load_model(folder).full_logits(ids)
    model = load_model(folder, quantization="int8")
    assert not any(isinstance(m, nn.Linear) and name.split(".")[-1] != "kv_b_proj" for name, m in model.named_modules())
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) > 0
    rel = ((model.full_logits(ids, path="absorbed") - ref).norm() / ref.norm()).item()
    assert rel < 0.03, f"relative logit error {rel:.4f}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_features", [48, 53])  # 53: padded to the kernel's 64 rows and cut back
def test_int4_kernel_matches_dequantized_weights(dtype, out_features):
    torch.manual_seed(0)
    linear = nn.Linear(96, out_features, bias=True).to(dtype)
    q = Int4Linear.from_linear(linear, qlinear.available())
    x = torch.randn(5, 96, dtype=dtype)
    codes, scale_zero = quantize_int4(linear.weight)
    dequant = dequantize_int4(codes, scale_zero.to(dtype))
    ref = x.float() @ dequant.T + linear.bias.float()
    assert q(x).shape == (5, out_features) and q(x[None]).shape == (1, 5, out_features)
    assert (q(x).float() - ref).abs().max().item() <= 0.02 * ref.abs().max().item()
    step = scale_zero[..., 0].max()  # a rounding error of at most half a step per weight
    assert (dequantize_int4(codes, scale_zero) - linear.weight.float()).abs().max() <= step / 2 + 1e-6


def test_int4_holds_q4_1_weights_exactly():
    """Q4_1 blocks (32 weights = q * d + m, q in 0..15) round-trip without loss."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(0, 16, (32, 4, 32), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15  # every block spans the full code range, as Q4_1's does
    d, m = torch.rand(32, 4, 1, generator=gen) * 0.01, torch.randn(32, 4, 1, generator=gen) * 0.01
    w = (q * d + m).view(32, 128)
    codes, scale_zero = quantize_int4(w)
    assert (dequantize_int4(codes, scale_zero) - w).abs().max() <= 1e-6


@torch.inference_mode()
@pytest.mark.parametrize("kernel", ["qlinear", "aten"])
def test_int4_model_stays_close_and_keeps_unsupported_shapes(tiny_checkpoints, kernel, monkeypatch):
    """int4 on latentkv's kernel takes every linear but kv_b_proj; on ATen's (the kernel not built)
    those with whole groups of inputs (K % 32 == 0), the others stay in the model dtype."""
    if kernel == "qlinear" and not qlinear.available():
        pytest.skip(f"qlinear not built: {qlinear.unavailable_reason()}")
    if kernel == "aten":
        monkeypatch.setattr(qlinear.EXT, "state", {"module": None, "reason": "test"})
    folder, _ = tiny_checkpoints("v2_dense")
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    ref = load_model(folder).full_logits(ids)
    model = load_model(folder, quantization="int4")
    linears = {
        n: m for n, m in model.named_modules() if isinstance(m, (nn.Linear, Int4Linear)) and not n.endswith("kv_b_proj")
    }
    int4 = {n for n, m in linears.items() if isinstance(m, Int4Linear)}
    assert int4 == {n for n, m in linears.items() if kernel == "qlinear" or m.in_features % 32 == 0}
    assert 0 < len(int4) and (len(int4) < len(linears)) == (
        kernel == "aten"
    )  # the tiny model's v_head_dim 12: o_proj K = 48
    assert all(m.uses_qlinear == (kernel == "qlinear") for n, m in linears.items() if n in int4)
    rel = ((model.full_logits(ids, path="absorbed") - ref).norm() / ref.norm()).item()
    assert rel < 0.15, f"relative logit error {rel:.4f}"


def test_unknown_quantization_is_refused(tiny_checkpoints):
    folder, _ = tiny_checkpoints("v2_dense")
    with pytest.raises(ValueError, match="quantization"):
        load_model(folder, quantization="int3")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "kind,uses_qlinear",
    [
        ("fixed-order", True),
        ("int8", True),
        ("int8", False),
        ("int4", True),
        ("int4", False),
        ("w4a8", True),
        ("w8a8", True),
    ],
)
def test_packing_in_row_blocks_gives_the_whole_matrix_bits(kind, uses_qlinear, dtype, monkeypatch):
    """pack_weights packs PACK_ELEMENTS weights at a time: 200 rows (not a multiple of the kernels' 64)
    in blocks of 64 rows give the buffers packing them at once gives, bit for bit."""
    if uses_qlinear and not qlinear.available():
        pytest.skip(f"qlinear not built: {qlinear.unavailable_reason()}")
    weight = torch.randn(200, 96, generator=torch.Generator().manual_seed(0)).to(dtype)
    packed = []
    for elements in (200 * 96, 1):  # whole; one block of 64 rows at a time
        monkeypatch.setattr(quant, "PACK_ELEMENTS", elements)
        linear = quant.LINEAR_CLASSES[kind](96, 200, uses_qlinear=uses_qlinear)
        linear.weight.data = weight.clone()
        linear.pack_weights()
        assert linear.packed and not hasattr(linear, "weight")
        packed.append(dict(linear.named_buffers()))
    assert packed[0].keys() == packed[1].keys() and packed[0]
    assert all(torch.equal(packed[0][name], packed[1][name]) for name in packed[0])
