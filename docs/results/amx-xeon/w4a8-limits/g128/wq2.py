import sys, json, torch
from pathlib import Path
from transformers import AutoTokenizer
from latentkv.model.loader import load_model
from latentkv.model.quant import quantize_int4, dequantize_int4
import latentkv
folder = sys.argv[1]
tok = AutoTokenizer.from_pretrained(folder)
text = (Path(latentkv.__file__).parent / "assets" / "prose.txt").read_text()
ids = torch.tensor(tok(text)["input_ids"][:1024])[None]
m = load_model(folder, dtype=torch.float32)
with torch.no_grad():
    lr = m.full_logits(ids).float().log_softmax(-1)
orig = {n: p.detach().clone() for n, p in m.named_parameters()}
def score(tag):
    with torch.no_grad():
        lq = m.full_logits(ids).float().log_softmax(-1)
    agree = (lq.argmax(-1) == lr.argmax(-1)).float().mean().item()
    kl = (lr.exp() * (lr - lq)).sum(-1).mean().item()
    print(tag, round(agree, 4), round(kl, 4), flush=True)
for g in (32, 64, 128):
    with torch.no_grad():
        for n, mod in m.named_modules():
            if isinstance(mod, torch.nn.Linear) and "kv_b_proj" not in n and n + ".weight" in orig:
                w = orig[n + ".weight"]
                k = w.shape[1]; pad = -k % g
                c, sz = quantize_int4(torch.nn.functional.pad(w, (0, pad)), g)
                mod.weight.copy_(dequantize_int4(c, sz, g)[:, :k])
    score(f"weights int4 g{g}")
