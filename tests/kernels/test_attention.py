"""kernels/attention.py prefill_finish: the bits of torch's (acc[..., :dv] / l).to(dtype), written into a view."""

import pytest
import torch

from latentkv.kernels import attention

pytestmark = pytest.mark.skipif(not attention.available(), reason="the native attention kernels are not built here")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_prefill_finish_is_torchs_division_and_rounding(dtype):
    gen = torch.Generator().manual_seed(0)
    acc = torch.randn(37, 3, 80, generator=gen) * 1e3
    acc[0, 0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 3e38])
    l = torch.rand(37, 3, generator=gen) + 1e-3
    l[1, 2] = 0.0
    out = torch.full((40, 3, 70), -7.0).to(dtype)
    attention.prefill_finish(acc, l, out[2:39])
    expected = (acc[..., :70] / l[..., None]).to(dtype)
    assert torch.equal(
        out[2:39].view(torch.int16 if dtype == torch.bfloat16 else torch.int32)[1:],
        expected.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)[1:],
    )
    torch.testing.assert_close(out[2], expected[0], equal_nan=True, rtol=0, atol=0)
    assert out[:2].eq(-7).all() and out[39:].eq(-7).all()  # nothing outside the view
