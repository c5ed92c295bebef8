"""The bytes a batch-1 decode step reads (bench/bandwidth.py weight_bytes): the bandwidth floor's numerator."""

import itertools

import pytest

from latentkv.bench.bandwidth import step_weight_bytes, weight_bytes
from latentkv.model.loader import load_model


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def test_a_moe_step_reads_the_experts_one_token_routes_to(tiny_checkpoints):
    folder = tiny_checkpoints("v2_lite_moe")[0]
    model = load_model(folder, quantization="w4a8")
    cfg = model.config
    routed = [m.experts for m in model.modules() if hasattr(m, "experts")]
    assert routed  # the config has MoE layers
    experts = sum(nbytes(itertools.chain(e.parameters(), e.buffers())) for e in routed)
    whole = nbytes(
        t
        for t in itertools.chain(model.parameters(), model.buffers())
        if t.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    )
    unread = experts * (1 - cfg.num_experts_per_tok / cfg.n_routed_experts)
    assert abs(weight_bytes(model) - (whole - unread)) <= len(routed)  # int rounding per layer
    assert weight_bytes(model) < whole


def test_a_step_reads_the_experts_its_tokens_touch(tiny_checkpoints):
    model = load_model(tiny_checkpoints("v2_lite_moe")[0], quantization="w4a8")
    cfg = model.config
    layers = sum(1 for m in model.modules() if hasattr(m, "experts"))
    k, everyone = [cfg.num_experts_per_tok] * layers, [cfg.n_routed_experts] * layers
    assert step_weight_bytes(model, k) == weight_bytes(model)
    whole = nbytes(
        t
        for t in itertools.chain(model.parameters(), model.buffers())
        if t.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    )
    assert step_weight_bytes(model, everyone) == whole  # every expert touched: every weight read
    more = [k[0] + 1] + k[1:]
    assert step_weight_bytes(model, more) > step_weight_bytes(model, k)
    with pytest.raises(ValueError, match="MoE layers"):
        step_weight_bytes(model, k + [1])
