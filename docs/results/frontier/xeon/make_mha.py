"""SmolLM2-135M in MHA shape: each of its 3 KV heads repeated for the 3 query heads that read it
(9 KV heads), so the model computes exactly what the original does with a 3x larger KV cache."""
import json, shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
src, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
cfg = json.loads((src / "config.json").read_text())
hkv, h, d = cfg["num_key_value_heads"], cfg["num_attention_heads"], cfg["head_dim"]
rep = h // hkv
w = load_file(src / "model.safetensors")
for k in list(w):
    if k.endswith(("k_proj.weight", "v_proj.weight")):
        t = w[k].view(hkv, d, -1)
        w[k] = t.repeat_interleave(rep, dim=0).reshape(h * d, -1).contiguous()
cfg["num_key_value_heads"] = h
save_file(w, out / "model.safetensors", metadata={"format": "pt"})
(out / "config.json").write_text(json.dumps(cfg, indent=2))
for f in src.iterdir():
    if f.name not in ("model.safetensors", "config.json"):
        shutil.copy(f, out / f.name)
print("wrote", out)
