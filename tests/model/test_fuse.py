"""Fused inference projections change no numbers."""
import pytest
import torch

from latentkv.model.loader import load_model


@torch.inference_mode()
@pytest.mark.parametrize("name", ["v3_moe_sigmoid", "v2_dense"])  # q_lora + MoE; plain q_proj
def test_fused_projections_give_the_same_logits(tiny_checkpoints, name):
    from latentkv.model.fuse import fuse_for_inference

    folder, _ = tiny_checkpoints(name)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    ref = load_model(folder).full_logits(ids)
    model = load_model(folder)
    fuse_for_inference(model)
    assert not hasattr(model.model.layers[0].self_attn, "kv_a_proj_with_mqa")
    assert (model.full_logits(ids) - ref).abs().max().item() <= 1e-5
