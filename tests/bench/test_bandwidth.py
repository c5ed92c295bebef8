"""The bytes a batch-1 decode step reads (bench/bandwidth.py weight_bytes): the bandwidth floor's numerator."""

import itertools

from latentkv.bench.bandwidth import weight_bytes
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
