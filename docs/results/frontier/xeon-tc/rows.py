"""Measure converted folders one by one against one Judge, writing each row as it completes."""
import json
import sys
from pathlib import Path

import torch

from latentkv.bench import frontier
from latentkv.sources.readers import read_source

if __name__ == "__main__":
    torch.set_num_threads(1)
    name, folders = sys.argv[1], sys.argv[2:]
    judge = frontier.Judge(read_source(None), 24, 1024, 512)  # 24 held-out prompts, 1,024 tokens a domain
    out = Path(f"/work/runs-tc/rows-{name}.jsonl")
    for f in folders:
        row = frontier.our_rows(judge, [(Path(f), None, f"latentkv convert --kv-bytes {Path(f).name[2:]} "
                                         "--kv-formats transform_code --kv-rope-dims all")], ["float32"])[0]
        with out.open("a") as fh:
            fh.write(json.dumps({**row, "original_ppl": judge.base}) + "\n")
