"""Final rows: agreement (24 held-out prompts, float32) and perplexity (1,024 tokens a domain, windows of
512) of allocations at budgets, the cache simulated, the conversion built as convert --kv-bytes builds it."""
from pathlib import Path
import json, sys
sys.path.insert(0, str(Path(__file__).parent))
from common import centred_energies, energies, means, model, src, tokenizer
from latentkv.bench import frontier
from latentkv.convert import bit_alloc
from latentkv.convert.simulated import coded_chat_model

out = sys.argv[1]; jobs = [j.split(":") for j in sys.argv[2:]]  # BUDGET:ALLOCATION[_c]
judge = frontier.Judge(src, 24, 1024, 512)
for b, name in jobs:
    b = int(b)
    if name.endswith("_c"):
        code = bit_alloc.allocation(name[:-2], centred_energies, b).centred([m[0] for m in means], [m[1] for m in means])
    else:
        code = bit_alloc.allocation(name, energies, b)
    row = {"kv_bytes": b, "allocation": name, "system": code.describe(), "bytes_per_token": code.bytes_per_token()}
    row.update(judge.measure(coded_chat_model(model, code, tokenizer, "")))
    row["original_ppl"] = judge.base
    with open(out, "a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)
