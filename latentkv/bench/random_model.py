"""`latentkv bench random-model`: a seeded random-weight checkpoint of a real DeepSeek shape
(bench/shapes.py), written as a Hugging Face folder, to measure loading, memory and speed at that
size where the real weights cannot be had.

Every linear weight and the embedding lie on the Q4_0 grid, so that 4-bit quantizations hold
exactly the values the bf16 folder holds: in each block of 32 consecutive inputs of a row,
w = d * (q - 8) with d a power of two (per block) and q in 0..15: one q = 0 and one q = 15 in every
block, the other 30 uniform in 1..15 (symmetric about 8: drawn from 0..15, every weight had a mean
of -d / 2, a rank-one part shared by all rows that pulled every token's stream the same way).
Q4_0 (d = the max-magnitude value / -8) and latentkv's int4 (model/quant.py quantize_int4:
scale = (max - min) / 15, zero = min + 8 * scale) both recover d and q exactly, and bf16 holds
d * (q - 8) exactly. d is scaled so a weight's std is about 1/sqrt(fan_in) (the embedding's about
1), and the projections back into the residual stream (o_proj, down_proj) by a further
1/sqrt(2 * layers) (GPT-2's initialization): activations stay O(1) through the layers and the
stream keeps its token's embedding, so the text does not collapse to a few tokens. Norm weights
are near 1, the router float32 (as the loader keeps it), V3's e_score_correction_bias small. Each
tensor draws from its own generator, seeded by the seed and its name: the same seed writes the
same bytes, whatever the shard size.

The folder carries the bundled SmolLM2 tokenizer (no DeepSeek tokenizer is available offline), so
bos / eos are its ids, not the release's; ids past its vocabulary exist in the model only.
"""

from __future__ import annotations

import copy
import json
import math
import zlib
from pathlib import Path

import torch
from tqdm.auto import tqdm

from latentkv.config import ModelConfig
from latentkv.convert.export import export
from latentkv.export.gguf_writer import export_gguf
from latentkv.model.deepseek import MLAForCausalLM
from latentkv.model.loader import checkpoint_slots, slot_shape
from latentkv.model.quant import INT4_GROUP as BLOCK  # Q4_0's block too: 32 inputs share one d
from latentkv.model.route import Route
from latentkv.sources.readers import read_source
from latentkv.sources.source_model import SourceModel

from .shapes import SHAPES

CODE_RMS = math.sqrt(sum((q - 8) ** 2 for q in range(1, 16)) / 15)  # rms of q - 8, q uniform in 1..15
NORM_NOISE, GATE_STD, BIAS_STD = 0.05, 1.0, 0.02  # norm weights 1 +- this; router logits' std; e_score bias
ROUTER = (".mlp.gate.weight", "e_score_correction_bias")  # float32 (the loader keeps the router so); the rest bf16


def shape_config(shape: str, source: SourceModel) -> dict:
    """The shape's config.json (a copy: transformers' configs edit the nested rope_scaling), with the
    bundled tokenizer's bos / eos ids."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {sorted(SHAPES)}")
    return {**copy.deepcopy(SHAPES[shape]), "bos_token_id": source.bos_token_id, "eos_token_id": source.eos_token_id}


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of every tensor the config implies (the loader's own slots, of the
    model built on the meta device), embeddings and head first, then layer by layer."""
    with torch.device("meta"):
        model = MLAForCausalLM(ModelConfig.from_dict(cfg), Route())
    params = dict(model.named_parameters(remove_duplicate=False))
    shapes = {
        name: slot_shape(params[pname], rows)
        for name, (pname, rows) in checkpoint_slots(model).items()
        if not (cfg.get("tie_word_embeddings") and name == "lm_head.weight")
    }

    def order(name: str) -> tuple:
        parts = name.split(".")
        layer = int(parts[2]) if name.startswith("model.layers.") else -1
        return layer, [int(p) if p.isdigit() else p for p in parts]  # experts 2 before 10

    return {name: shapes[name] for name in sorted(shapes, key=order)}


def generator(seed: int, name: str) -> torch.Generator:
    # the CPU generator (mt19937) keeps 32 bits of its seed: seed and name hashed together
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}".encode()))


def q4_grid(shape: tuple[int, int], std: float, gen: torch.Generator) -> torch.Tensor:
    """[N, K] bf16 on the Q4_0 grid (module docstring) with a std of about `std`."""
    n, k = shape
    if k % BLOCK:
        raise ValueError(f"a {n}x{k} weight has {k} inputs, not a multiple of {BLOCK}: it cannot lie on the Q4_0 grid")
    blocks = k // BLOCK
    q = torch.randint(1, 16, (n, blocks, BLOCK), generator=gen, dtype=torch.int8)
    low = torch.randint(0, BLOCK, (n, blocks, 1), generator=gen)
    high = (low + torch.randint(1, BLOCK, (n, blocks, 1), generator=gen)) % BLOCK  # another input of the block
    q.scatter_(2, low, 0).scatter_(2, high, 15)
    # d = 2^e per block, e one of two exponents around std / CODE_RMS, half the blocks of a row each
    # (rows of equal norm: with the exponents drawn freely, the few lm_head rows of the largest norm
    # won the argmax for any input and the text fell into them)
    upper = torch.rand(n, blocks, generator=gen).argsort(dim=1) < blocks // 2
    exponent = math.floor(math.log2(std / CODE_RMS)) + upper.view(n, blocks, 1)
    # in float32, in place (exact: a power of two times a small integer); bf16 arithmetic ran ~7x slower
    return q.sub_(8).float().mul_(torch.pow(2.0, exponent.float())).to(torch.bfloat16).view(n, k)


def value_dtype(name: str) -> torch.dtype:
    return torch.float32 if name.endswith(ROUTER) else torch.bfloat16


def random_tensor(name: str, shape: tuple[int, ...], seed: int, layers: int) -> torch.Tensor:
    gen = generator(seed, name)
    if name.endswith("e_score_correction_bias"):
        return torch.randn(shape, generator=gen) * BIAS_STD
    if name.endswith(".mlp.gate.weight"):
        return torch.randn(shape, generator=gen) * (GATE_STD / math.sqrt(shape[1]))
    if len(shape) == 1:  # RMSNorm weights (the shapes have no biases)
        return (1 + NORM_NOISE * torch.randn(shape, generator=gen)).to(torch.bfloat16)
    if name == "model.embed_tokens.weight":
        return q4_grid(shape, 1.0, gen)
    residual = name.endswith(("o_proj.weight", "down_proj.weight"))
    return q4_grid(shape, 1 / math.sqrt(shape[1] * (2 * layers if residual else 1)), gen)


def write_random_model(
    shape: str, out: str | Path, seed: int = 0, shard_bytes: int | None = None, source: SourceModel | None = None
) -> Path:
    """Write the random checkpoint of `shape` to `out`: config.json, safetensors shards (one shard
    in memory at a time, export.write_weights), the tokenizer of `source` (default: the bundled
    SmolLM2 GGUF), generation_config.json and a model card."""
    if not 0 <= seed < 2**31:
        raise ValueError(f"seed must be in 0..2^31-1, got {seed}")
    source = source or read_source()
    cfg = shape_config(shape, source)
    shapes = tensor_shapes(cfg)
    total = sum(math.prod(size) * value_dtype(name).itemsize for name, size in shapes.items())

    def parts():
        with tqdm(total=total, desc=f"writing {shape}", unit="B", unit_scale=True, unit_divisor=1024) as bar:
            for name, size in shapes.items():
                tensor = random_tensor(name, size, seed, cfg["num_hidden_layers"])
                bar.update(tensor.nbytes)
                yield {name: tensor}

    out = export(Path(out), source, cfg, parts(), info={}, settings={}, shard_bytes=shard_bytes)
    params = sum(math.prod(size) for size in shapes.values())
    (out / "README.md").write_text(model_card(shape, cfg, seed, params, len(source.tokenizer())))
    return out


def write_gguf_twin(folder: Path, out: Path | None = None) -> Path:
    """The folder as a Q4_0 GGUF (default: beside it, `<folder>-Q4_0.gguf`), holding the same values."""
    return export_gguf(
        Path(folder), Path(out) if out else Path(folder).with_name(Path(folder).name + "-Q4_0.gguf"), outtype="q4_0"
    )


def model_card(shape: str, cfg: dict, seed: int, params: int, tokenizer_vocab: int) -> str:
    vocab = cfg["vocab_size"]
    return "\n".join(
        [
            "---",
            "library_name: transformers",
            f"tags: [latentkv, random-weights, {cfg['model_type']}]",
            "---",
            "",
            f"# Random weights, {shape} shape",
            "",
            f"Written by `latentkv bench random-model --shape {shape} --seed {seed}`: {params / 1e6:,.1f}M parameters "
            "of random values, for measuring loading, memory and speed. It knows no language: its text is noise.",
            "",
            "- **Values**: every linear weight and the embedding lie on the Q4_0 grid (in each block of 32 inputs, "
            "w = d * (q - 8), d a power of two, one q = 0 and one q = 15), so Q4_0 and latentkv's int4 hold exactly "
            "these bf16 values; norm weights near 1; the router in float32.",
            "- **Tokenizer**: the SmolLM2 tokenizer bundled with latentkv (no DeepSeek tokenizer is available "
            f"offline), so `bos_token_id` / `eos_token_id` are its ids "
            f"({cfg['bos_token_id']} / {cfg['eos_token_id']}), "
            "not the release's (DeepSeek-V2-Lite: 100000 / 100001). "
            + (
                f"The model's vocabulary ({vocab}) is larger than the tokenizer's: ids past it are never produced by "
                "the tokenizer, and decode to nothing when the model generates them."
                if vocab > tokenizer_vocab
                else "The model's vocabulary is the tokenizer's."
            ),
            "- **Config**: " + json.dumps({k: v for k, v in cfg.items() if k != "architectures"}),
            "",
        ]
    )
