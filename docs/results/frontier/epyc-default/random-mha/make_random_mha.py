"""SmolLM2-135M in a random MHA shape, from its repeated-head MHA folder (../../xeon/make_mha.py: 9 KV
heads, each KV head copied for its 3 query heads), rewritten in place: the first head of each group keeps the
original's K/V rows; the other two get random rows (seeded) of the same per-row norms, so no two KV heads share
anything — the case where a latent has no redundancy to remove (the repeated-head model is the other extreme)."""
import json, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
folder = Path(sys.argv[1])
cfg = json.loads((folder / "config.json").read_text())
h, d = cfg["num_attention_heads"], cfg["head_dim"]
rep = h // int(sys.argv[2])  # query heads per KV head of the original
gen = torch.Generator().manual_seed(0)
w = load_file(folder / "model.safetensors")
for k in sorted(w):
    if k.endswith(("k_proj.weight", "v_proj.weight")):
        t = w[k].view(h, d, -1).clone()
        for head in range(h):
            if head % rep:
                r = torch.randn(t[head].shape, generator=gen)
                t[head] = r * (t[head].norm(dim=-1, keepdim=True) / r.norm(dim=-1, keepdim=True))
        w[k] = t.reshape(h * d, -1).contiguous()
save_file(w, folder / "model.safetensors", metadata={"format": "pt"})
print("rewrote", folder)
