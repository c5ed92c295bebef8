"""The conversion's perplexity check, one layer's weights at a time.

Loading the source and the converted model whole in float32 costs 2 × 4 bytes per parameter
(8.8 GiB peak at the 1B shape, ~64 GB at 8B). Here the residual stream of the evaluation windows
([N, T, D] float32: 32 MiB for 4096 tokens at hidden 2048) is carried from layer to layer and
only the current layer's weights are held — the same forward, so the same numbers (tested
against `source_logits` and `load_model(...).full_logits`).
Shapes: ids [1, T], hidden [1, T, D].
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from latentkv.config import ModelConfig
from latentkv.eval.perplexity import layerwise_perplexity
from latentkv.model.deepseek import MLAForCausalLM
from latentkv.model.loader import empty_model, load_weights
from latentkv.model.route import decide_route
from latentkv.model.shards import open_safetensors, read_checked, weight_files
from latentkv.model.norm import rms_norm
from latentkv.model.packed import PackedLinear
from latentkv.rope import layer_inv_freq
from latentkv.sources.reference import decoder_layer
from latentkv.sources.source_model import SourceModel


def source_perplexity(src: SourceModel, windows: torch.Tensor, desc: str = "perplexity (source)") -> dict:
    """perplexity(lambda ids: source_logits(src, ids), windows), reading each layer once."""
    positions = torch.arange(windows.shape[1])

    def layers() -> Iterator[Callable]:
        for i in range(src.num_layers):
            yield lambda h, i=i: decoder_layer(src, i, h, positions)

    embedding = src.tensors["model.embed_tokens.weight"]  # read once (a streamed source reads per access)
    norm = src.tensors["model.norm.weight"]
    head = src.tensors["lm_head.weight"] if "lm_head.weight" in src.tensors else embedding  # tied: one copy
    return layerwise_perplexity(
        lambda ids: F.embedding(ids, embedding),
        layers(),
        lambda h: F.linear(rms_norm(h, norm, src.rms_norm_eps), head),
        windows,
        desc,
    )


def materialize(module: torch.nn.Module) -> None:
    """Give a meta-device module CPU storage to be filled by load_weights (as loader.empty_model:
    a packed linear's part without a bias stays zero)."""
    module.to_empty(device="cpu")
    for m in module.modules():
        if isinstance(m, PackedLinear) and m.bias is not None:
            m.bias.data.zero_()


def tensor_files(folder: Path) -> dict[str, Path]:
    """Checkpoint name -> the shard holding it (headers only)."""
    where = {}
    for file in weight_files(folder):
        with open_safetensors(file) as f:
            where.update({name: file for name in f.keys()})
    return where


def read_tensors(names: list[str], where: dict[str, Path], cfg: ModelConfig):
    """(name, tensor, file) of the named checkpoint tensors, for load_weights."""
    for file in sorted({where[n] for n in names}):
        with open_safetensors(file) as f:
            stored = set(f.keys())
            for name in sorted(n for n in names if where[n] == file):
                for target, tensor in read_checked(f, name, stored, cfg, file):
                    yield target, tensor, file


def skeleton(folder: Path) -> tuple[MLAForCausalLM, dict[str, Path]]:
    """The converted model with only embeddings, final norm and lm_head in memory (float32); its
    decoder layers stay on the meta device until layer_runner loads them."""
    cfg = ModelConfig.from_file(folder / "config.json")
    model = empty_model(cfg, decide_route("cpu", torch.float32), "meta")  # built for the CPU it runs on
    where = tensor_files(folder)
    top = [model.model.embed_tokens, model.model.norm] + ([] if cfg.tie_word_embeddings else [model.lm_head])
    for module in top:
        materialize(module)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for i, layer in enumerate(model.model.layers):  # rope tables of every layer are built at once (tiny)
        layer.self_attn.inv_freq = layer_inv_freq(cfg, i)
    names = [n for n in where if not n.startswith("model.layers.")]
    load_weights(model, read_tensors(names, where, cfg), torch.float32, partial=True)
    return model.eval(), where


def converted_perplexity(folder: Path, windows: torch.Tensor, desc: str = "perplexity (converted)") -> dict:
    """perplexity(load_model(folder, float32).full_logits, windows), holding one decoder layer."""
    folder = Path(folder)
    model, where = skeleton(folder)
    cfg = model.config

    def layers() -> Iterator[Callable]:
        for i, layer in enumerate(model.model.layers):
            materialize(layer)
            layer.self_attn.inv_freq = layer_inv_freq(cfg, i)  # to_empty left it uninitialized
            prefix = f"model.layers.{i}."
            load_weights(
                model, read_tensors([n for n in where if n.startswith(prefix)], where, cfg), torch.float32, partial=True
            )
            yield lambda h, i=i: model.forward_layer(i, h)
            layer.to_empty(device="meta")  # this layer's weights go
            layer.self_attn.inv_freq = layer_inv_freq(cfg, i)

    return layerwise_perplexity(
        model.model.embed_tokens, layers(), lambda h: model.compute_logits(model.model.norm(h)), windows, desc
    )
