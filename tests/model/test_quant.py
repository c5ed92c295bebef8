"""Weight-only int8 linears: the kernel and its fallback agree with dequantized weights,
and a quantized model stays close to the float one."""
import pytest
import torch
from torch import nn

from latentkv.model.loader import load_model
from latentkv.model.quant import Int8Linear, quantize_linears


@pytest.mark.parametrize("in_features", [64, 24])  # kernel path (K % 16 == 0) and fallback
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_matches_dequantized_weights(in_features, dtype):
    torch.manual_seed(0)
    linear = nn.Linear(in_features, 48, bias=True).to(dtype)
    q = Int8Linear(linear)
    x = torch.randn(5, in_features, dtype=dtype)
    dequant = q.weight_int8.float() * q.scales.float()[:, None]
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
    model = load_model(folder)
    assert quantize_linears(model) > 0
    assert not any(isinstance(m, nn.Linear) and name.split(".")[-1] != "kv_b_proj" for name, m in model.named_modules())
    rel = ((model.full_logits(ids, path="absorbed") - ref).norm() / ref.norm()).item()
    assert rel < 0.03, f"relative logit error {rel:.4f}"

