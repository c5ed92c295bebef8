"""A transform-coded folder served by the engine (reference attention backend, the coded paged cache)
against the simulated reference (convert/simulated.py) on held-out chat prompts, in float32 and bfloat16:
- greedy answers compared token by token (served by the engine; the reference's by full forwards);
- teacher-forced top-1 agreement on the reference's answers: the engine's top token (prompt logprobs)
  against the reference's answer token, and, as the scale of float noise through the code, the
  reference against itself (its argmax over the whole sequence in one forward against the token it
  chose from the prefix alone: the same positions, only the sequence length differs).

Usage: python served_vs_simulated.py FOLDER [N_PROMPTS] [MAX_TOKENS]
(FOLDER: `latentkv convert --kv-bytes 5760 --kv-formats transform_code --kv-rope-dims all --eval-tokens 0`)."""

import json
import sys

import torch

from latentkv import LLM, SamplingParams
from latentkv.cache.transform_code import folder_code
from latentkv.convert.simulated import simulate
from latentkv.engine.chat_template import render_chat
from latentkv.eval.chat import greedy_uncached
from latentkv.model.loader import load_model
from latentkv.sources.chat_data import load_chat, user_message

folder = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 48
examples = load_chat(None, "heldout")[:n]
for dtype in ("float32", "bfloat16"):
    llm = LLM(folder, dtype=dtype, kv_cache_memory="64MiB")
    engine = llm.llm_engine
    tok = llm.get_tokenizer()
    prompts = [render_chat(tok, user_message(e.prompt))[1] for e in examples]
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    served = [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    model = simulate(load_model(folder, dtype=getattr(torch, dtype)), folder_code(engine.cfg))
    logits = lambda ids: model.full_logits(ids, cache_dtype="auto")  # noqa: E731
    reference = greedy_uncached(logits, prompts, [max_tokens] * n, engine.eos_token_ids)
    forced = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    rows, agree, self_agree, total = [], 0, 0, 0
    for e, prompt, a, b in zip(examples, prompts, served, reference):
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        ids = prompt + b
        lp = llm.generate([{"prompt_token_ids": ids}], forced, use_tqdm=False)[0].prompt_logprobs
        top = [next(t for t, v in lp[p].items() if v.rank == 1) for p in range(len(prompt), len(ids))]
        whole = logits(torch.tensor([ids]))[0, len(prompt) - 1 : -1].argmax(-1).tolist()
        agree += sum(x == y for x, y in zip(top, b))
        self_agree += sum(x == y for x, y in zip(whole, b))
        total += len(b)
        rows.append({"id": e.id, "identical": a == b, "served_tokens": len(a), "first_difference": first})
    print(
        json.dumps(
            {
                "dtype": dtype,
                "bytes_per_token_engine": engine.kv_bytes_per_token,
                "bytes_per_token_format": folder_code(engine.cfg).bytes_per_token(),
                "identical": sum(r["identical"] for r in rows),
                "prompts": n,
                "max_tokens": max_tokens,
                "teacher_forced_top1_served_vs_reference": agree / total,
                "teacher_forced_top1_reference_whole_vs_prefix": self_agree / total,
                "answer_tokens": total,
                "rows": rows,
            }
        )
    )
    sys.stdout.flush()
