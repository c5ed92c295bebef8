"""Agreement (and KL) on held-out prompts of the uniform floor, per-side water-filling and the
global allocation at the given budgets."""
from pathlib import Path
import json, sys, time
sys.path.insert(0, str(Path(__file__).parent))
from common import Judge, energies, centred_energies, means
from latentkv.convert import bit_alloc

n = int(sys.argv[1]); budgets = [int(b) for b in sys.argv[2].split(",")]; names = sys.argv[3].split(",")
judge = Judge("heldout", n)
for b in budgets:
    for name in names:
        t0 = time.time()
        if name.endswith("_c"):
            code = bit_alloc.allocation(name[:-2], centred_energies, b).centred([m[0] for m in means], [m[1] for m in means])
        else:
            code = bit_alloc.allocation(name, energies, b)
        agree, kl = judge.score(code)
        row = {"kv_bytes": b, "allocation": name, "bytes": code.bytes_per_token(), "agreement": agree, "kl": kl,
               "prompts": n, "desc": code.describe(), "s": round(time.time() - t0)}
        print(json.dumps(row), flush=True)
