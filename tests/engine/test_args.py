"""EngineArgs checks every option once, when built, with the option's one rule."""

import pytest
import torch

from latentkv.engine.args import EngineArgs


def test_values_are_cleaned_once():
    args = EngineArgs("m", dtype="bf16", kv_cache_dtype="fp8", kv_cache_memory="2GiB", quantization="none")
    assert (args.dtype, args.kv_cache_dtype, args.kv_cache_memory, args.quantization) == (
        "bfloat16",
        "fp8_e4m3",
        2 * 2**30,
        None,
    )
    assert EngineArgs("m", dtype=torch.float32).dtype is torch.float32


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"kv_cache_dtype": "int4"}, "kv_cache_dtype = 'int4' is not valid; allowed: one of"),
        ({"kv_cache_dtype": "float16"}, "kv_cache_dtype = 'float16'"),  # no silent "auto"
        ({"block_size": 24}, "block_size = 24"),
        ({"kv_cache_memory": "lots"}, "kv_cache_memory = 'lots'.*memory size"),
        ({"kv_cache_fraction": 1.5}, "kv_cache_fraction"),
        ({"attention_path": "fast"}, "attention_path"),
        ({"kv_cache_memory": "1MiB", "kv_cache_blocks": 4}, "not both"),
    ],
)
def test_bad_options_name_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs("m", **kwargs)
