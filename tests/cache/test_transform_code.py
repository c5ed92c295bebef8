"""The transform-coded cache format: bytes, the record read back exactly, and every mixed-bit
format's quantize -> dequantize against a reference written out here."""

from __future__ import annotations

import pytest
import torch

from latentkv.cache import q4
from latentkv.cache import transform_code as tc


def reference_round_trip(x: torch.Tensor, bits: list[int], group: int) -> torch.Tensor:
    """The format's definition, one group and one token at a time, in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for b in range(1, tc.MAX_BITS + 1):
        idx = [i for i, bi in enumerate(bits) if bi == b]
        for start in range(0, len(idx), group):
            run = idx[start : start + group]
            turn = q4.turn(torch.eye(len(run))).double().T  # column j: R e_j
            for t in range(x.shape[0]):
                y = turn @ x[t, run].double()
                rms = float(torch.tensor(float(y.square().mean().sqrt())).half())
                step = tc.STEP[b] * rms
                levels = 1 << b
                u = [min(max(int(torch.floor(v / step)) + levels // 2, 0), levels - 1) for v in y.float().double()]
                back = torch.tensor([(ui - levels // 2 + 0.5) * step for ui in u], dtype=torch.float64)
                out[t, run] = turn.T @ back
    return out


@pytest.mark.parametrize("group", [3, 64])
def test_every_mixed_bit_format_round_trips_as_its_reference(group):
    gen = torch.Generator().manual_seed(0)
    bits = [b for b in range(tc.MAX_BITS + 1) for _ in range(5)] + [4] * 70  # every bit value; a run over 64
    bits = [bits[i] for i in torch.randperm(len(bits), generator=gen)]
    x = torch.randn(6, len(bits), generator=gen) * torch.logspace(1, -2, len(bits))
    got = tc.round_trip(x, bits, group)
    want = reference_round_trip(x, bits, group)
    assert (got.double() - want).abs().max() <= 1e-4 * x.abs().max()
    zero = [i for i, b in enumerate(bits) if b == 0]
    assert torch.equal(got[:, zero], torch.zeros(6, len(zero)))


@pytest.mark.parametrize("b", range(1, tc.MAX_BITS + 1))
def test_the_error_per_bit_is_the_gaussian_quantizers(b):
    """On Gaussian rows each added bit cuts the error as the table says (within sampling noise and
    the per-token RMS, which adapts to each row)."""
    x = torch.randn(4000, 64, generator=torch.Generator().manual_seed(b))
    err = float((tc.round_trip(x, [b] * 64) - x).square().mean())
    assert 0.7 * tc.DISTORTION[b] <= err <= 1.05 * tc.DISTORTION[b]


def test_codes_stay_in_range_and_the_bytes_count_codes_and_scales():
    x = torch.randn(5, 10) * 1e3
    bits = [8, 8, 3, 3, 3, 1, 0, 0, 2, 2]
    codes, scales = tc.encode(x, bits, group=2)
    sizes = [len(idx) for _, idx in tc.groups(bits, 2)]
    assert sizes == [1, 2, 2, 1, 2] and codes.shape == (5, 8) and scales.shape == (5, 5)
    at = 0
    for (b, _), n in zip(tc.groups(bits, 2), sizes):
        assert int(codes[:, at : at + n].max()) < (1 << b)
        at += n
    # 8+8+9+1+4 = 30 code bits -> 4 bytes; groups of 2: {1}:1, {2}:1, {3}:2, {8}:1 -> 5 scales of 2 bytes
    assert tc.layer_bytes(bits[:6], bits[6:], group=2) == 4 + 2 * 5


def test_the_record_reads_back_exactly_and_a_bad_one_is_refused():
    code = tc.TransformCode(((8, 3, 0), (2, 2, 2)), ((4, 4), (0, 0)), group=16)
    assert tc.TransformCode.from_dict(code.to_dict(), layers=2) == code
    assert code.ranks() == [2, 3] and code.bytes_per_token() == code.layer_bytes(0) + code.layer_bytes(1)
    bad = code.to_dict() | {"latent_bits": [[9, 0, 0], [1, 1, 1]]}
    with pytest.raises(ValueError, match="0..8"):
        tc.TransformCode.from_dict(bad)
    with pytest.raises(ValueError, match="3 lists"):
        tc.TransformCode.from_dict(code.to_dict(), layers=3)
    with pytest.raises(ValueError, match="kind"):
        tc.TransformCode.from_dict({"kind": "q4_0"})


def test_a_centred_record_reads_back_exactly_and_bad_means_are_refused():
    code = tc.TransformCode(((8, 3, 0), (2, 2, 2)), ((4, 4), (0, 0)), group=16)
    centred = code.centred([[0.5, -1.0, 2.0], [0.0, 0.25, 3.0]], [[1.5, -2.5], [0.0, 1.0]])
    assert tc.TransformCode.from_dict(centred.to_dict(), layers=2) == centred != code
    assert centred.bytes_per_token() == code.bytes_per_token()  # the means are format constants
    for bad in ({"rope_mean": [[1.0], [0.0, 1.0]]}, {"latent_mean": [[0.5, float("nan"), 2.0], [0.0, 0.25, 3.0]]}):
        with pytest.raises(ValueError, match="finite numbers per direction"):
            tc.TransformCode.from_dict(centred.to_dict() | bad)
    with pytest.raises(ValueError, match="come together"):
        tc.TransformCode.from_dict(centred.to_dict() | {"rope_mean": None})


def test_a_centred_code_codes_the_rows_less_their_mean():
    """An offset per direction, 20x the spread (a rope key's per-channel offset): coded less the
    mean the error is the spread's; coded as it is, the offset's range costs its resolution."""
    gen = torch.Generator().manual_seed(4)
    mean = torch.randn(64, generator=gen) * 20.0
    x = mean + torch.randn(256, 64, generator=gen)
    bits = [3] * 64
    centred = tc.round_trip(x, bits, mean=mean)
    assert torch.equal(centred, tc.round_trip(x - mean, bits) + mean)
    err_centred = (centred - x).square().mean()
    assert err_centred <= 2 * tc.DISTORTION[3]  # about the Gaussian quantizer's error on the unit spread
    assert (tc.round_trip(x, bits) - x).square().mean() > 20 * err_centred


def test_maps_first_made_under_inference_mode_still_serve_autograd():
    """The per-bits maps are cached: the engine (inference mode) may make them first, the simulation's
    heal (autograd) use them next."""
    bits = [3, 0, 5, 5, 2, 7, 1, 4, 4, 6, 8, 3, 2]
    with torch.inference_mode():
        tc.round_trip(torch.randn(2, len(bits)), bits, 4)
    x = torch.randn(3, len(bits), requires_grad=True)
    tc.round_trip(x, bits, 4).sum().backward()
    assert x.grad is not None
