"""Top-1 agreement and KL of a w4a8 model's next-token logits vs the float32 model on held-out prose + code."""
import sys, json, torch
from pathlib import Path
from transformers import AutoTokenizer
from latentkv.model.loader import load_model
import latentkv
folder = sys.argv[1]
tok = AutoTokenizer.from_pretrained(folder)
text = (Path(latentkv.__file__).parent / "assets" / "prose.txt").read_text()
ids = torch.tensor(tok(text)["input_ids"][:1024])[None]
torch.manual_seed(0)
ref = load_model(folder, dtype=torch.float32)
with torch.no_grad():
    lr = ref.full_logits(ids).float().log_softmax(-1)
del ref
out = {}
for q in sys.argv[2:] or ["w4a8", "int4"]:
    m = load_model(folder, dtype=torch.float32, quantization=q)
    with torch.no_grad():
        lq = m.full_logits(ids).float().log_softmax(-1)
    agree = (lq.argmax(-1) == lr.argmax(-1)).float().mean().item()
    kl = (lr.exp() * (lr - lq)).sum(-1).mean().item()
    nll = -lq[0, :-1].gather(-1, ids[0, 1:, None]).mean().item()
    out[q] = dict(agreement=round(agree, 4), kl=round(kl, 5), ppl=round(float(torch.tensor(nll).exp()), 3))
    del m
nll = -lr[0, :-1].gather(-1, ids[0, 1:, None]).mean().item()
out["float32"] = dict(ppl=round(float(torch.tensor(nll).exp()), 3))
print(json.dumps(out))
