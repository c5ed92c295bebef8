"""llama.cpp runs our GGUF exports as latentkv runs the folders: the same greedy tokens and the same
logits, through llama-cpp-python (skipped where it is not installed: `pip install llama-cpp-python`).

Every tiny DeepSeek shape latentkv's parity tests use that llama.cpp can represent (V2 / V3, dense
and MoE, q_lora, softmax and sigmoid routing with expert groups, YaRN, rope halves, tied embeddings,
rms_norm_eps far from the latent norms' 1e-6), two YaRN variants whose scales llama.cpp computes
differently (gguf_metadata.rope_scaling_keys), a Llama converted with `--stock`, and a 102400-row
vocabulary with SmolLM2's 49152-token tokenizer.

Both run float32 weights and llama.cpp a float32 KV cache, so the logits differ only by summation
order and by llama.cpp's own rope tables (sin / cos of products computed in float32); measured, at
most ~4e-6 on logits of magnitude ~3 over these 24 positions. TOL = 1e-4 is 25 times that, and far
below what any mapping error in the export gives: without the latent eps scaling 0.09, rope halves
left as they are 3, YaRN's attention scale left out 2.2 (measured by breaking each on purpose).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from tokenizers import processors

from latentkv import LLM, SamplingParams
from latentkv.convert import convert
from latentkv.convert.options import ConvertOptions
from latentkv.export import export_gguf
from latentkv.model.loader import load_model
from gguf_files import EXPORTABLE, save_deepseek
from tiny_lm import VOCAB, build_tokenizer, save_tiny_llama

llama_cpp = pytest.importorskip("llama_cpp")

TOL = 1e-4  # module docstring
STEPS = 16
YARN_VARIANTS = {  # over v2_yarn's rope_parameters
    "yarn_cos_sin_factor": {"mscale": 1.0, "mscale_all_dim": 0.707},  # rope.scaling.attn_factor != 1
    "yarn_plain_scale": {"mscale": 0.0, "mscale_all_dim": 0.0, "attention_factor": 1.0},  # no yarn_log_multiplier
}


def run_llama_cpp(path, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """(greedy tokens after `prompt`, logits [len(prompt) + steps - 1, vocab] of prompt + tokens)."""
    llm = llama_cpp.Llama(
        str(path),
        n_ctx=64,
        n_batch=64,
        logits_all=True,
        n_threads=1,
        verbose=False,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
    )
    llm.eval(prompt)
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        if len(tokens) < steps:
            llm.eval(tokens[-1:])
    return tokens, np.array(llm.scores[: llm.n_tokens])


def latentkv_greedy(folder, prompt: list[int], steps: int) -> list[int]:
    llm = LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", max_model_len=128)
    out = llm.generate(
        [{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True), use_tqdm=False
    )
    return list(out[0].outputs[0].token_ids)


def assert_llama_cpp_runs_it_as_latentkv(folder, tmp_path, vocab: int, seed: int = 0):
    path = export_gguf(folder, tmp_path / f"{folder.name}.gguf", "f32")
    prompt = torch.randint(2, vocab, (8,), generator=torch.Generator().manual_seed(seed)).tolist()
    theirs, logits = run_llama_cpp(path, prompt, STEPS)
    ours = latentkv_greedy(folder, prompt, STEPS)
    assert theirs == ours
    reference = load_model(folder, dtype=torch.float32).full_logits(torch.tensor([prompt + ours[:-1]]))[0].numpy()
    assert logits.shape == reference.shape
    diff = np.abs(logits - reference).max()
    assert diff <= TOL, f"{folder.name}: llama.cpp's logits differ from latentkv's by {diff:.2e}"


@pytest.mark.parametrize("name", EXPORTABLE)
def test_llama_cpp_runs_the_tiny_deepseek_shapes(tiny_lm, tmp_path, name):
    folder, hf, _ = tiny_lm(name)
    assert_llama_cpp_runs_it_as_latentkv(folder, tmp_path, hf.config.vocab_size)


@pytest.mark.parametrize("variant", sorted(YARN_VARIANTS))
def test_llama_cpp_runs_yarn_scales_deepseek_does_not_use(tiny_lm, tmp_path, variant):
    src, hf, _ = tiny_lm("v2_yarn")
    folder = tmp_path / variant
    shutil.copytree(src, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg["rope_parameters"], **YARN_VARIANTS[variant]}
    (folder / "config.json").write_text(json.dumps(cfg))
    assert_llama_cpp_runs_it_as_latentkv(folder, tmp_path, hf.config.vocab_size)


def test_llama_cpp_runs_a_stock_conversion_of_a_llama(tmp_path):
    src = save_tiny_llama(tmp_path / "llama")
    options = ConvertOptions(
        stock=True, target="any", rope_dim=8, kv_rank=24, calib_tokens=256, ctx=32, eval_tokens=0, calib_chat=0
    )
    folder = convert(str(src), str(tmp_path / "stock"), options)
    assert "latentkv" not in json.loads((folder / "config.json").read_text())
    assert_llama_cpp_runs_it_as_latentkv(folder, tmp_path, 320)


def test_llama_cpp_tokenizes_as_the_folder_does(tiny_lm, padded_vocab, smollm2_tokenizer, tmp_path):
    """The tiny byte-level BPE (llama.cpp's gpt-2 pre-tokenizer), the same putting BOS first, and
    SmolLM2's (smollm) in a model whose vocabulary is padded from 49152 to 102400 rows: llama.cpp
    loads them and splits text into the ids the folder's tokenizer gives, BOS included or not."""
    text = "héllo wörld, ça va? 日本語 1314151 and 3.33 -- def main(): return 42  😀 I've been 'told"
    folder, _, tiny = tiny_lm("v2_dense")
    with_bos = build_tokenizer()
    with_bos.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)]
    )
    bos_folder = save_deepseek(tmp_path / "bos", with_bos, VOCAB)
    assert with_bos.encode(text)[0] == 0
    for model, tok in ((folder, tiny), (bos_folder, with_bos), (padded_vocab, smollm2_tokenizer)):
        llm = llama_cpp.Llama(
            str(export_gguf(model, tmp_path / f"{model.name}.gguf", "f32")), n_ctx=32, vocab_only=True, verbose=False
        )
        assert llm.n_vocab() == json.loads((model / "config.json").read_text())["vocab_size"]
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == tok.encode(text, add_special_tokens=False)
        assert llm.tokenize(text.encode(), add_bos=True, special=False) == tok.encode(text)  # BOS as the folder's
    assert_llama_cpp_runs_it_as_latentkv(padded_vocab, tmp_path, 49152)
