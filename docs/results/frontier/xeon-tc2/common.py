"""Shared by the experiment scripts: the calibration saved by calib.py, the transform-coded
conversion at rope "all" built in memory as convert --kv-bytes builds it, the held-out judge."""
from pathlib import Path
import json
import torch
from safetensors.torch import load_file
from latentkv.convert import bit_alloc, budget
from latentkv.convert.calibrate import LayerStats
from latentkv.convert.layout import converted_model
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model, plan_rope
from latentkv.convert.simulated import simulate
from latentkv.eval.chat import ChatModel, render_cases
from latentkv.sources.chat_data import load_chat
from latentkv.sources.readers import read_source
from latentkv.sources.reference import source_logits

torch.set_num_threads(1)
src = read_source(None)
t = load_file(str(Path(__file__).parent / "stats.safetensors"))
stats = [LayerStats(t[f"{i}.xx"], t[f"{i}.dist"], t[f"{i}.rho"], t[f"{i}.kappa"], int(t[f"{i}.tokens"]))
         for i in range(src.num_layers)]
options = ConvertOptions(kv_bytes=5760, eval_tokens=0)
settings = budget.candidate_options(options, budget.Candidate(192, 192, budget.TRANSFORM, 5760))
cfg, tensors, _ = build_model(src, stats, settings, plan_rope(src, stats, settings))
energies = bit_alloc.model_energies(cfg, tensors, stats, options.k_weight)
centred_energies = bit_alloc.model_energies(cfg, tensors, stats, options.k_weight, centred=True)
means = [bit_alloc.layer_means(cfg, tensors, i, st) for i, st in enumerate(stats)]
model = converted_model(cfg, tensors)
tokenizer = src.tokenizer()


class Judge:
    def __init__(self, split, n):
        ref = ChatModel(lambda ids: source_logits(src, ids), tokenizer, "source", str(src.path))
        self.cases = render_cases(tokenizer, load_chat(src.path, split)[:n])
        self.ref_lp = [ref.answer_logprobs(c) for c in self.cases]

    def score(self, code):
        simulate(model, code)
        mine = ChatModel(lambda ids: model.full_logits(ids, cache_dtype="auto"), tokenizer, "m", "")
        agree = total = 0
        kl = 0.0
        for c, r in zip(self.cases, self.ref_lp):
            lp = mine.answer_logprobs(c)
            agree += int((lp.argmax(-1) == r.argmax(-1)).sum())
            total += len(r)
            kl += float((r.exp() * (r - lp)).sum())
        return agree / total, kl / total
