"""One calibration (the --kv-bytes default options), its statistics saved as safetensors."""
from pathlib import Path
import torch
from safetensors.torch import save_file
from latentkv.convert.api import calibration_windows
from latentkv.convert.calibrate import collect_stats
from latentkv.convert.options import ConvertOptions, calib_torch_dtype
from latentkv.sources.readers import read_source

torch.set_num_threads(1)
src = read_source(None)
o = ConvertOptions(kv_bytes=5760, eval_tokens=0)
windows, weights = calibration_windows(src, None, o.calib_tokens, o.ctx, o.calib_chat, o.calib_weight)
stats = collect_stats(src, windows, dtype=calib_torch_dtype(o.calib_dtype), weights=weights)
t = {}
for i, s in enumerate(stats):
    t.update({f"{i}.xx": s.xx, f"{i}.dist": s.dist, f"{i}.rho": s.rho, f"{i}.kappa": s.kappa,
              f"{i}.tokens": torch.tensor(s.tokens)})
save_file({k: v.contiguous() for k, v in t.items()}, str(Path(__file__).parent / "stats.safetensors"))
print("saved", len(stats))
