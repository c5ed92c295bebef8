"""How far float noise carries through a transform-coded cache, and that the coded paged cache computes
the simulation's numbers on the same path (float32, 60 random tokens).

Usage: python noise.py FOLDER"""

import sys

import torch

from latentkv.cache.transform_code import folder_code
from latentkv.config import ModelConfig
from latentkv.convert.simulated import simulate
from latentkv.facts import TRANSFORM_CODE
from latentkv.model.loader import load_model

folder = sys.argv[1]
code = folder_code(ModelConfig.from_file(f"{folder}/config.json"))
ids = torch.randint(100, 20000, (1, 60), generator=torch.Generator().manual_seed(0))


def length_noise(logits) -> str:
    """The same 45 positions scored in a 60- and a 45-token sequence: max |difference| per position."""
    d = (logits(ids)[0, :45] - logits(ids[:, :45])[0]).abs().amax(-1)
    return f"max {d.max().item():.3g}, median {d.median().item():.3g}"


simulated = simulate(load_model(folder, dtype=torch.float32), code)
plain = load_model(folder, dtype=torch.float32, attention_backend="torch")
print("simulated code, 60 vs 45 tokens:", length_noise(lambda x: simulated.full_logits(x, cache_dtype="auto")))
print("no code, 60 vs 45 tokens:", length_noise(lambda x: plain.full_logits(x, cache_dtype="auto")))
served = plain.full_logits(ids, cache_dtype=TRANSFORM_CODE)[0]  # through the coded paged cache
reference = simulated.full_logits(ids, cache_dtype="auto")[0]
print("coded paged cache vs simulated, one forward: max |difference|", (served - reference).abs().max().item())
