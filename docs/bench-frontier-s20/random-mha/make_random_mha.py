"""SmolLM2-135M in a random MHA shape: 9 KV heads, one per query head. The first head of each group keeps the
original's K/V rows; the other two get random rows (seeded) of the same per-row norms, so no two KV heads share
anything — the case where a latent has no redundancy to remove (the repeated-head model is the other extreme)."""
import json, shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
src, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
cfg = json.loads((src / "config.json").read_text())
hkv, h, d = cfg["num_key_value_heads"], cfg["num_attention_heads"], cfg["head_dim"]
rep = h // hkv
gen = torch.Generator().manual_seed(0)
w = load_file(src / "model.safetensors")
for k in sorted(w):
    if k.endswith(("k_proj.weight", "v_proj.weight")):
        t = w[k].view(hkv, d, -1).repeat_interleave(rep, dim=0).clone()   # [h, d, D]
        for head in range(h):
            if head % rep:
                r = torch.randn(t[head].shape, generator=gen)
                t[head] = r * (t[head].norm(dim=-1, keepdim=True) / r.norm(dim=-1, keepdim=True))
        w[k] = t.reshape(h * d, -1).contiguous()
cfg["num_key_value_heads"] = h
save_file(w, out / "model.safetensors", metadata={"format": "pt"})
(out / "config.json").write_text(json.dumps(cfg, indent=2))
for f in src.iterdir():
    if f.name not in ("model.safetensors", "config.json"):
        shutil.copy(f, out / f.name)
print("wrote", out)
