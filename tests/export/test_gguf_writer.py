"""`export_gguf` read back through gguf.GGUFReader: every tensor's values against the folder's in
llama.cpp's deepseek2 layout (gguf_files.expected_tensors), the metadata llama.cpp reads, each
outtype's storage, and an interrupted export leaving no file."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from gguf_files import EXPORTABLE, expected_tensors, read_gguf
from latentkv.config import ModelConfig
from latentkv.export import export_gguf
from latentkv.export.gguf_check import ExportError
from latentkv.export.gguf_metadata import latent_scale
from latentkv.export.gguf_writer import OUTTYPE_CHOICES
from latentkv.model.shards import CheckpointError
from latentkv.model.spec import LATENT_NORM_EPS


@pytest.mark.parametrize("name", EXPORTABLE)
def test_float32_round_trip_is_exact(tiny_lm, tmp_path, name):
    folder, _, _ = tiny_lm(name)
    _, tensors = read_gguf(export_gguf(folder, tmp_path / "m.gguf", "f32"))
    expected = expected_tensors(folder)
    assert sorted(tensors) == sorted(expected)
    for tname, values in expected.items():
        kind, got = tensors[tname]
        assert kind == "F32" and got.shape == values.shape, (tname, kind, got.shape, values.shape)
        np.testing.assert_array_equal(got, values, err_msg=tname)


def test_metadata_of_a_v3_moe_with_q_lora_and_groups(tiny_lm, tmp_path):
    folder, hf, _ = tiny_lm("v3_moe_sigmoid")
    fields, _ = read_gguf(export_gguf(folder, tmp_path / "m.gguf"))
    c = hf.config
    arch = "deepseek2."
    assert fields["general.architecture"] == "deepseek2"
    assert fields["general.file_type"] == gguf.LlamaFileType.ALL_F32  # auto: the folder's float32
    expected = {
        "block_count": c.num_hidden_layers,
        "context_length": c.max_position_embeddings,
        "embedding_length": 64,
        "feed_forward_length": c.intermediate_size,
        "vocab_size": c.vocab_size,
        "attention.head_count": c.num_attention_heads,
        "attention.head_count_kv": 1,
        "attention.q_lora_rank": c.q_lora_rank,
        "attention.kv_lora_rank": c.kv_lora_rank,
        "attention.key_length": c.kv_lora_rank + c.qk_rope_head_dim,
        "attention.value_length": c.kv_lora_rank,
        "attention.key_length_mla": c.qk_nope_head_dim + c.qk_rope_head_dim,
        "attention.value_length_mla": c.v_head_dim,
        "rope.dimension_count": c.qk_rope_head_dim,
        "leading_dense_block_count": c.first_k_dense_replace,
        "expert_count": c.n_routed_experts,
        "expert_used_count": c.num_experts_per_tok,
        "expert_shared_count": c.n_shared_experts,
        "expert_feed_forward_length": c.moe_intermediate_size,
        "expert_weights_norm": True,
        "expert_gating_func": int(gguf.ExpertGatingFuncType.SIGMOID),
        "expert_group_count": c.n_group,
        "expert_group_used_count": c.topk_group,
    }
    assert {k: fields[arch + k] for k in expected} == expected
    assert fields[arch + "expert_weights_scale"] == pytest.approx(c.routed_scaling_factor)
    assert fields[arch + "attention.layer_norm_rms_epsilon"] == pytest.approx(c.rms_norm_eps)
    assert fields[arch + "rope.freq_base"] == pytest.approx(c.rope_parameters["rope_theta"])
    assert not any("rope.scaling" in k for k in fields)


def test_metadata_of_a_dense_v2_with_yarn_and_softmax_moe(tiny_lm, tmp_path):
    dense, _, _ = tiny_lm("v2_dense")
    fields, _ = read_gguf(export_gguf(dense, tmp_path / "dense.gguf"))
    assert fields["deepseek2.attention.q_lora_rank"] == 0  # llama.cpp requires the key; 0 means attn_q
    assert fields["deepseek2.leading_dense_block_count"] == 3 and fields["deepseek2.expert_shared_count"] == 0
    assert "deepseek2.expert_count" not in fields and "deepseek2.expert_used_count" not in fields

    folder, hf, _ = tiny_lm("v2_yarn")
    fields, _ = read_gguf(export_gguf(folder, tmp_path / "yarn.gguf"))
    yarn = hf.config.rope_parameters
    assert fields["deepseek2.expert_gating_func"] == int(gguf.ExpertGatingFuncType.SOFTMAX)
    assert fields["deepseek2.expert_weights_norm"] is False  # V2 without norm_topk_prob
    assert "deepseek2.expert_group_count" not in fields  # greedy: no group limit
    assert fields["deepseek2.rope.scaling.type"] == "yarn"
    assert fields["deepseek2.rope.scaling.factor"] == pytest.approx(yarn["factor"])
    assert fields["deepseek2.rope.scaling.original_context_length"] == yarn["original_max_position_embeddings"]
    # DeepSeek's mscale == mscale_all_dim: convert_hf_to_gguf's value, and no attention factor
    assert fields["deepseek2.rope.scaling.yarn_log_multiplier"] == pytest.approx(0.1 * yarn["mscale_all_dim"])
    assert "deepseek2.rope.scaling.attn_factor" not in fields


def test_tokenizer_metadata(tiny_lm, tmp_path):
    folder, _, tok = tiny_lm("v2_dense")
    fields, _ = read_gguf(export_gguf(folder, tmp_path / "m.gguf"))
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
    vocab = tok.get_vocab()
    assert fields["tokenizer.ggml.tokens"] == sorted(vocab, key=vocab.get)
    assert (
        fields["tokenizer.ggml.bos_token_id"] == tok.bos_token_id
        and fields["tokenizer.ggml.eos_token_id"] == tok.eos_token_id
    )
    types = fields["tokenizer.ggml.token_type"]
    assert types[tok.bos_token_id] == types[tok.eos_token_id] == gguf.TokenType.CONTROL
    assert types[300] == gguf.TokenType.NORMAL
    merges = json.loads((folder / "tokenizer.json").read_text())["model"]["merges"]
    assert len(fields["tokenizer.ggml.merges"]) == len(merges)
    assert fields["tokenizer.chat_template"] == tok.chat_template
    # the tiny tokenizer adds no BOS / EOS when encoding: said explicitly (llama.cpp's default varies)
    assert fields["tokenizer.ggml.add_bos_token"] is False and fields["tokenizer.ggml.add_eos_token"] is False


def grid_folder(src, dst, seed: int = 0):
    """src's checkpoint with every matrix (the router aside) moved onto the Q4_0 grid: each block of
    32 values d·(q − 8), d a power of two, q in 0..15 and one q = 0 per block (its -8·d sets d). The
    matrices stored as float16 (rows not whole blocks) hold these values exactly too."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    gen = torch.Generator().manual_seed(seed)
    tensors = load_file(str(src / "model.safetensors"))
    for name, t in tensors.items():
        if t.dim() == 2 and t.numel() % 32 == 0 and not name.endswith(".mlp.gate.weight"):
            blocks = t.numel() // 32
            q = torch.randint(0, 16, (blocks, 32), generator=gen)
            q[torch.arange(blocks), torch.randint(0, 32, (blocks,), generator=gen)] = 0
            d = 2.0 ** -torch.randint(3, 8, (blocks, 1), generator=gen).float()
            tensors[name] = (d * (q - 8)).reshape(t.shape).to(t.dtype)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_q4_0_of_grid_valued_weights_is_lossless(tiny_lm, tmp_path):
    folder = grid_folder(tiny_lm("v3_moe_sigmoid")[0], tmp_path / "grid")
    fields, tensors = read_gguf(export_gguf(folder, tmp_path / "m.gguf", "q4_0"))
    assert fields["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_0
    kinds = {name: kind for name, (kind, _) in tensors.items()}
    assert kinds["blk.1.ffn_gate_exps.weight"] == kinds["token_embd.weight"] == kinds["blk.0.attn_q_a.weight"] == "Q4_0"
    # kept float: norms and the router f32, attn_k_b / attn_v_b and rows of 24 or 48 (not 32-blocks) f16
    assert (
        kinds["blk.0.attn_norm.weight"]
        == kinds["blk.1.ffn_gate_inp.weight"]
        == kinds["blk.1.exp_probs_b.bias"]
        == "F32"
    )
    assert (
        kinds["blk.0.attn_k_b.weight"] == kinds["blk.0.attn_q_b.weight"] == kinds["blk.0.attn_output.weight"] == "F16"
    )
    for name, values in expected_tensors(folder).items():
        np.testing.assert_array_equal(tensors[name][1], values, err_msg=name)


@pytest.mark.parametrize("outtype,step", [("q8_0", 127), ("q4_1", 15)])
def test_quantized_values_are_within_one_step_of_the_folder(tiny_lm, tmp_path, outtype, step):
    """Per 32-block: Q8_0 steps of max|x| / 127, Q4_1 of (max - min) / 15 (plus float16 scales)."""
    folder, _, _ = tiny_lm("v3_moe_sigmoid")
    _, tensors = read_gguf(export_gguf(folder, tmp_path / "m.gguf", outtype))
    quantized = 0
    for name, values in expected_tensors(folder).items():
        kind, got = tensors[name]
        if kind != outtype.upper():
            assert kind in ("F32", "F16"), (name, kind)
            continue
        quantized += 1
        blocks, ref = got.reshape(-1, 32), values.reshape(-1, 32)
        width = np.abs(ref).max(1) if outtype == "q8_0" else ref.max(1) - ref.min(1)
        assert (np.abs(blocks - ref) <= (width / step * 0.51 + 1e-3 * width)[:, None]).all(), name
    assert quantized >= 10


@pytest.mark.parametrize("outtype,dtype", [("bf16", torch.bfloat16), ("f16", torch.float16)])
def test_half_precision_outtypes_are_the_rounded_values(tiny_lm, tmp_path, outtype, dtype):
    folder, _, _ = tiny_lm("v3_yarn_halves_tied")
    _, tensors = read_gguf(export_gguf(folder, tmp_path / "m.gguf", outtype))
    for name, values in expected_tensors(folder).items():
        kind, got = tensors[name]
        want = values if values.ndim == 1 else torch.from_numpy(values).to(dtype).float().numpy()
        assert kind == ("F32" if values.ndim == 1 else outtype.upper()), (name, kind)
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_auto_keeps_a_bf16_folder_bf16(tiny_lm, tmp_path):
    src, _, _ = tiny_lm("v2_dense")
    folder = Path(shutil.copytree(src, tmp_path / "bf16"))
    save_file(
        {k: v.to(torch.bfloat16) for k, v in load_file(str(src / "model.safetensors")).items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    fields, tensors = read_gguf(export_gguf(folder, tmp_path / "m.gguf"))
    assert fields["general.file_type"] == gguf.LlamaFileType.MOSTLY_BF16
    for name, values in expected_tensors(folder).items():  # bf16 -> bf16: bit for bit
        np.testing.assert_array_equal(tensors[name][1], values, err_msg=name)


def test_zero_shared_experts_become_one_zero_expert(tiny_lm, tmp_path):
    """llama.cpp's deepseek2 always adds a shared expert; with zero weights it adds exactly 0."""
    src, _, _ = tiny_lm("v3_moe_sigmoid")
    folder = Path(shutil.copytree(src, tmp_path / "noshared"))
    cfg = json.loads((src / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "n_shared_experts": 0}))
    save_file(
        {k: v for k, v in load_file(str(src / "model.safetensors")).items() if "shared_experts" not in k},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    fields, tensors = read_gguf(export_gguf(folder, tmp_path / "m.gguf"))
    assert fields["deepseek2.expert_shared_count"] == 1
    _, up = tensors["blk.1.ffn_up_shexp.weight"]
    assert up.shape == (cfg["moe_intermediate_size"], cfg["hidden_size"]) and not up.any()


def test_bad_inputs_are_refused_and_leave_no_file(tiny_lm, tmp_path):
    folder, _, _ = tiny_lm("v2_dense")
    out = tmp_path / "m.gguf"
    with pytest.raises(ExportError, match="outtype 'q2_k' is not one of"):
        export_gguf(folder, out, "q2_k")
    assert "auto" in OUTTYPE_CHOICES
    with pytest.raises(CheckpointError, match="no config.json"):
        export_gguf(tmp_path, out)
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in folder.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.2.mlp.down_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"missing tensor model\.layers\.2\.mlp\.down_proj\.weight"):
        export_gguf(broken, out)
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
    tensors["model.layers.2.mlp.down_proj.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"down_proj\.weight in .* has shape \(3, 3\)"):
        export_gguf(broken, out)
    assert not out.exists()


def test_latent_scale_matches_the_norm_it_replaces():
    """RMSNorm(k·x, eps') = RMSNorm(x, eps' / k²): the identity the latent row scaling rests on."""
    x = torch.randn(5, 16, dtype=torch.float64) * 1e-3  # small, so the eps matters
    eps = 1e-2
    k = latent_scale(
        ModelConfig(
            model_type="deepseek_v3",
            vocab_size=8,
            hidden_size=8,
            intermediate_size=8,
            num_hidden_layers=1,
            num_attention_heads=1,
            kv_lora_rank=16,
            qk_nope_head_dim=2,
            qk_rope_head_dim=2,
            v_head_dim=2,
            rms_norm_eps=eps,
        )
    )
    assert k == pytest.approx(math.sqrt(eps / LATENT_NORM_EPS))

    def norm(v, e):
        return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + e)

    torch.testing.assert_close(norm(k * x, eps), norm(x, LATENT_NORM_EPS))
