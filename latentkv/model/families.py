"""Model families: config.json's `model_type` -> what latentkv needs to serve that family.

A `ModelFamily` names its config reader (config.json -> ModelConfig), its layer spec (model/spec.py:
a decoder layer's shapes and options), its module class (built from the config and the route) and
its checkpoint tensor names beyond the module's own parameter names (the layer prefix, what is
stored beside the weights, stacked experts). The loader (model/loader.py) reads every folder
through it; docs/internals.md, "Adding a model family", says how to add one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from torch import nn

from ..config import DEEPSEEK_LAYOUTS, ModelConfig, unknown_model_type
from ..facts import MLA_MODEL_TYPES
from .deepseek import MLAForCausalLM
from .route import Route
from .spec import LayerSpec, layer_spec


@dataclass(frozen=True)
class CheckpointNames:
    """How a family's safetensors name their tensors where the module's parameter names do not say."""

    layer: re.Pattern  # a decoder layer's tensor, group 1 its index (past num_hidden_layers: skipped)
    skip_suffixes: tuple[str, ...]  # stored beside the weights, not read as weights
    fused_experts: re.Pattern | None = None  # a MoE layer's experts stacked: group 1 the prefix, 2 the projection


@dataclass(frozen=True)
class ModelFamily:
    model_type: str  # config.json's
    read_config: Callable[[dict], ModelConfig]  # the parsed config.json -> its ModelConfig (ConfigError if bad)
    layer_spec: Callable[[ModelConfig, int], LayerSpec]  # the one the module's layer i is built from
    module: Callable[[ModelConfig, Route], nn.Module]  # the causal LM: forward, compute_logits, pack_weights
    checkpoint: CheckpointNames


# DeepSeek's checkpoints as published: parameter names as the modules', the multi-token-prediction
# layers past num_hidden_layers, fp8 block scales read with their weight (shards.dequantize_fp8),
# transformers' stacked experts; and rotary inverse frequencies some exports store.
DEEPSEEK_NAMES = CheckpointNames(
    layer=re.compile(r"^model\.layers\.(\d+)\."),
    skip_suffixes=("weight_scale_inv", "rotary_emb.inv_freq"),
    fused_experts=re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$"),
)


def deepseek_family(model_type: str) -> ModelFamily:
    layout = DEEPSEEK_LAYOUTS[model_type]
    return ModelFamily(
        model_type, lambda raw: ModelConfig.read_deepseek(raw, layout), layer_spec, MLAForCausalLM, DEEPSEEK_NAMES
    )


# each DeepSeek layout is a family (a family of another layout: its own entry here)
FAMILIES: dict[str, ModelFamily] = {name: deepseek_family(name) for name in DEEPSEEK_LAYOUTS}
# the names everyone else checks a folder against (resolve, eval, chat data) are these
assert set(FAMILIES) == set(MLA_MODEL_TYPES), "facts.MLA_MODEL_TYPES lists the registered families"


def family(model_type: str | None) -> ModelFamily:
    """The registered family of a model_type; a ConfigError naming the known ones otherwise."""
    if model_type not in FAMILIES:
        raise unknown_model_type(model_type, FAMILIES)
    return FAMILIES[model_type]


def read_config(source: dict | str | Path) -> ModelConfig:
    """A config.json (its path, or its parsed dict) -> ModelConfig, by its model_type's family;
    errors name the file."""
    if isinstance(source, dict):
        return family(source.get("model_type")).read_config(source)
    return ModelConfig.from_file(source, read_config)
