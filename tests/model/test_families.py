"""model/families.py: every registered family loads its tiny checkpoints (tests/tiny.py) through its
own config reader, module class, layer spec and checkpoint names; an unknown model_type is refused
with a message naming the known ones; the DeepSeek layouts keep V2's and V3's defaults apart."""

import json
import shutil

import pytest
import torch
from safetensors import safe_open

from latentkv.config import ConfigError, ModelConfig
from latentkv.facts import MLA_MODEL_TYPES
from latentkv.model.families import FAMILIES, family, read_config
from latentkv.model.loader import load_model
from latentkv.model.shards import weight_files

from tiny import BASE, CONFIGS, MOE

KIND = {"deepseek_v2": "v2", "deepseek_v3": "v3"}  # tests/tiny.py's name for each family's configs


def test_the_registry_is_the_model_types_latentkv_serves():
    assert set(FAMILIES) == set(MLA_MODEL_TYPES) == set(KIND)
    assert all(f.model_type == name for name, f in FAMILIES.items())


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@torch.inference_mode()
def test_each_family_loads_its_tiny_checkpoints(tiny_checkpoints, model_type):
    entry = FAMILIES[model_type]
    names = [name for name, (kind, _) in CONFIGS.items() if kind == KIND[model_type]]
    assert names
    for name in names:
        folder = tiny_checkpoints(name)[0]
        raw = json.loads((folder / "config.json").read_text())
        assert raw["model_type"] == model_type
        cfg = entry.read_config(raw)
        assert cfg == read_config(folder / "config.json") == ModelConfig.from_dict(raw)
        model = load_model(folder)
        assert type(model) is entry.module and model.config == cfg
        for i, layer in enumerate(model.model.layers):
            assert layer.spec == entry.layer_spec(cfg, i)
        with safe_open(str(weight_files(folder)[0]), framework="pt") as f:
            layers = {int(m.group(1)) for m in map(entry.checkpoint.layer.match, f.keys()) if m}
        assert layers == set(range(cfg.num_hidden_layers)), name


def test_an_unknown_model_type_is_refused_naming_the_known_ones(tiny_checkpoints, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_checkpoints("v2_dense")[0], folder)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "model_type": "minicpm3"}))
    calls = (lambda: load_model(folder), lambda: family("minicpm3"), lambda: read_config({**raw, "model_type": None}))
    for call in calls:
        with pytest.raises(ConfigError) as err:
            call()
        assert all(repr(name) in str(err.value) for name in FAMILIES), str(err.value)
    with pytest.raises(ConfigError, match=r"m/config\.json: config\.json: model_type 'minicpm3' is not supported"):
        load_model(folder)


def test_v2_and_v3_fill_what_their_config_leaves_out_as_transformers_does():
    raw = {**BASE, **MOE, "num_experts_per_tok": 1, "rope_interleave": False}
    v2 = family("deepseek_v2").read_config({**raw, "model_type": "deepseek_v2"})
    v3 = family("deepseek_v3").read_config({**raw, "model_type": "deepseek_v3"})
    assert (v2.topk_method, v2.scoring_func, v2.norm_topk_prob) == ("greedy", "softmax", False)
    assert (v3.topk_method, v3.scoring_func, v3.norm_topk_prob) == ("noaux_tc", "sigmoid", True)
    assert v2.rope_interleave and not v3.rope_interleave  # V2 always interleaves its rope pairs
    # one chosen expert: V3 normalizes its weight (to 1), V2 only when it chose more than one
    both = {**raw, "norm_topk_prob": True}
    assert family("deepseek_v3").read_config({**both, "model_type": "deepseek_v3"}).normalizes_topk
    assert not family("deepseek_v2").read_config({**both, "model_type": "deepseek_v2"}).normalizes_topk
    two = {**both, "model_type": "deepseek_v2", "num_experts_per_tok": 2}
    assert family("deepseek_v2").read_config(two).normalizes_topk
