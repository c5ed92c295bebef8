"""The measured allocation: side KLs probed on 8 calibration prompts at each budget's uniform code,
saved; then the allocation scored on held-out prompts."""
from pathlib import Path
import json, sys, time
sys.path.insert(0, str(Path(__file__).parent))
from common import Judge, energies, model, src, tokenizer
from latentkv.convert import bit_alloc
import probes as sensitivity  # the probes, beside this script
from latentkv.eval.chat import ChatModel, render_cases
from latentkv.sources.chat_data import load_chat
from latentkv.sources.reference import source_logits

n = int(sys.argv[1]); budgets = [int(b) for b in sys.argv[2].split(",")]
judge = Judge("heldout", n)
reference = ChatModel(lambda ids: source_logits(src, ids), tokenizer, "source", str(src.path), memoize=True)
cases = render_cases(tokenizer, load_chat(src.path, "calib")[: sensitivity.PROBE_EXAMPLES])

def kl(m):
    return sensitivity.answer_kl(ChatModel(lambda ids: m.full_logits(ids, cache_dtype="auto"), tokenizer, "m", ""), reference, cases)

for b in budgets:
    t0 = time.time()
    sizes = [(len(l), len(r)) for l, r in energies]
    probe = bit_alloc.uniform(sizes, b)
    kls = sensitivity.side_kls(model, probe, kl)
    json.dump({"kv_bytes": b, "kls": kls}, open(str(Path(__file__).parent / f"kls{b}.json"), "w"))
    code = bit_alloc.allocate(sensitivity.weighted(energies, probe, kls), b)
    agree, k = judge.score(code)
    print(json.dumps({"kv_bytes": b, "allocation": "measured", "bytes": code.bytes_per_token(), "agreement": agree,
                      "kl": k, "prompts": n, "desc": code.describe(), "s": round(time.time() - t0),
                      "latent_ranks": code.ranks()}), flush=True)
