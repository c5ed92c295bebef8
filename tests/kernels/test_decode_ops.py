"""decode_ops' rope and write_latent: every ISA path this CPU runs stores the scalar path's bits
(their row loops are not contracted into FMAs), on shapes with vector tails and strided inputs."""

import pytest
import torch

from latentkv.kernels import decode_ops

pytestmark = pytest.mark.skipif(not decode_ops.available(), reason="the fused decode ops are not built here")

DTYPES = [torch.float32, torch.bfloat16]


def isas() -> list[int]:
    """The masks of the paths beside scalar that serve here (0: the scalar path's)."""
    return [decode_ops.EXT.path_caps(path).mask for path in decode_ops.EXT.supported_isas() if path != "scalar"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("d", [2, 38, 64])
@torch.no_grad()
def test_rope_bits_on_every_isa(dtype, interleaved, d):
    gen = torch.Generator().manual_seed(d)
    x = (torch.randn(7, 5, d + 9, generator=gen) * 4).to(dtype)[..., 3 : 3 + d]  # rows strided
    cos, sin = torch.randn(7, d // 2, generator=gen), torch.randn(7, d // 2, generator=gen)
    module = decode_ops.extension()
    none = torch.empty(0, dtype=torch.long)
    ref = module.rope(x, cos, sin, interleaved, 0, none)
    for isa in isas():
        assert torch.equal(module.rope(x, cos, sin, interleaved, isa, none), ref), isa
    # slots: pair i turns by column slots[i] of wider tables, read in place
    wide_cos, wide_sin = torch.randn(7, d + 3, generator=gen), torch.randn(7, d + 3, generator=gen)
    slots = torch.randint(0, d + 3, (d // 2,), generator=gen)
    picked = module.rope(x, wide_cos[:, slots], wide_sin[:, slots], interleaved, 0, none)
    for isa in [0] + isas():
        assert torch.equal(module.rope(x, wide_cos, wide_sin, interleaved, isa, slots), picked), isa
    with pytest.raises(RuntimeError, match="slot outside"):
        module.rope(x, wide_cos, wide_sin, interleaved, 0, slots + d + 3)


def write_all(module, isa, c, k_r, cos, sin, interleaved, slots, cache: dict) -> list[torch.Tensor]:
    none = c.new_empty(0)
    out = {name: t.clone() for name, t in cache.items()}
    if "kv" in out:
        module.write_latent(c, k_r, cos, sin, interleaved, slots, out["kv"], none, none, none, 0.0, isa)
    else:
        module.write_latent(
            c,
            k_r,
            cos,
            sin,
            interleaved,
            slots,
            none,
            out["latent"],
            out["scale"],
            out["rope"],
            cache["qmax"].item(),
            isa,
        )
    return [t for name, t in out.items() if name != "qmax"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["plain", "int8", "int8_rope8", "fp8", "rope16"])
@pytest.mark.parametrize("rank,dr", [(192, 192), (37, 18), (24, 0)])
@torch.no_grad()
def test_write_latent_bits_on_every_isa(dtype, layout, rank, dr):
    if layout == "rope16" and dtype == torch.bfloat16:
        pytest.skip("a bf16 rope key beside float32 activations only")
    gen = torch.Generator().manual_seed(rank + dr)
    t, slots_n = 19, 40
    x = (torch.randn(t, rank + dr + 5, generator=gen) * 3).to(dtype)
    c, k_r = x[:, :rank], x[:, rank + 5 :]  # views with a row stride
    cos, sin = torch.randn(t, dr // 2, generator=gen), torch.randn(t, dr // 2, generator=gen)
    slots = torch.randperm(slots_n, generator=gen)[:t]
    if layout == "plain":
        cache = {"kv": torch.zeros(slots_n, rank + dr, dtype=dtype)}
    else:
        rope_dtype = {"int8_rope8": torch.int8, "rope16": torch.bfloat16}.get(layout, dtype)
        cache = {
            "latent": torch.zeros(slots_n, rank, dtype=torch.uint8 if layout == "fp8" else torch.int8),
            "scale": torch.zeros(slots_n, 2 if layout == "int8_rope8" else 1),
            "rope": torch.zeros(slots_n, dr, dtype=rope_dtype),
            "qmax": torch.tensor(448.0 if layout == "fp8" else 127.0),
        }
    module = decode_ops.extension()
    for interleaved in (True, False):
        ref = write_all(module, 0, c, k_r, cos, sin, interleaved, slots, cache)
        assert any(r.ne(0).any() for r in ref)
        for isa in isas():
            for ours, theirs in zip(write_all(module, isa, c, k_r, cos, sin, interleaved, slots, cache), ref):
                assert torch.equal(ours, theirs), (isa, interleaved)
