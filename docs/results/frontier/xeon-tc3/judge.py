"""Agreement (24 held-out chat prompts, float32 and bf16) and perplexity (float32, 1,024 tokens a domain, windows of 512) of
transform-coded folders, their cache simulated: the measurement of docs/results/frontier/xeon-tc2/rows.py
applied to folders (a conversion and its heal).

    python judge.py THREADS FOLDER...   # one JSON line a folder (the first: the original's perplexity)
"""
import json
import sys
from pathlib import Path

import torch

from latentkv.bench import frontier
from latentkv.cache import transform_code as tc
from latentkv.config import ModelConfig
from latentkv.sources.readers import read_source

torch.set_num_threads(int(sys.argv[1]))
src = read_source(None)
judge = frontier.Judge(src, 24, 1024, 512)
print(json.dumps({"original_ppl": judge.base}), flush=True)
for folder in sys.argv[2:]:
    code = tc.folder_code(ModelConfig.from_file(Path(folder) / "config.json"))
    row = {"folder": Path(folder).name, "system": code.describe(), "bytes_per_token": code.bytes_per_token()}
    row.update(judge.mla(Path(folder), None, "float32", code))
    row.update(judge.mla(Path(folder), None, "bfloat16", code))  # agreement only
    print(json.dumps(row), flush=True)
