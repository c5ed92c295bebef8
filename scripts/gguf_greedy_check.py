"""Does llama.cpp run a `latentkv export --gguf` file as latentkv runs the folder? Greedy tokens of
both on a few prompts (chat-templated by the folder's tokenizer, the same ids fed to both), the
largest logit difference on the first, and whether llama.cpp tokenizes the prompts' text as the
folder's tokenizer does. Needs llama-cpp-python.

    latentkv convert --stock --out ./smollm2-stock
    latentkv export --gguf ./smollm2-stock smollm2-f32.gguf --outtype f32
    python scripts/gguf_greedy_check.py ./smollm2-stock smollm2-f32.gguf [--tokens 32]

In float32 (f32 file, float32 latentkv, f32 llama.cpp KV cache) the tokens should be equal and the
logits within ~1e-3; a quantized file parts from latentkv's float model somewhere: the script says
where.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from llama_cpp import GGML_TYPE_F32, Llama

from latentkv import LLM, SamplingParams
from latentkv.engine.chat_template import render_chat
from latentkv.model.loader import load_model

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Name three fruits that are red.",
    "Explain in one sentence why the sky is blue.",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder")
    p.add_argument("gguf")
    p.add_argument("--tokens", type=int, default=32)
    args = p.parse_args()
    ours = LLM(args.folder, dtype="float32", max_model_len=1024)
    tok = ours.get_tokenizer()
    ids = [render_chat(tok, [{"role": "user", "content": q}])[1] for q in PROMPTS]
    greedy = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    theirs = Llama(args.gguf, n_ctx=1024, logits_all=True, verbose=False, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    for k, (question, prompt) in enumerate(zip(PROMPTS, ids)):
        a = list(ours.generate([{"prompt_token_ids": prompt}], greedy, use_tqdm=False)[0].outputs[0].token_ids)
        theirs.reset()
        theirs.eval(prompt)
        b = []
        for _ in range(args.tokens):
            b.append(int(np.argmax(theirs.scores[theirs.n_tokens - 1])))
            theirs.eval(b[-1:])
        part = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        same_text = theirs.tokenize(question.encode(), add_bos=False, special=False) == tok.encode(
            question, add_special_tokens=False
        )
        print(
            f"{question!r}: {'equal' if part is None else f'part at token {part}'} "
            f"(tokenization {'equal' if same_text else 'DIFFERS'})\n"
            f"  latentkv:  {tok.decode(a)!r}\n  llama.cpp: {tok.decode(b)!r}"
        )
        if k == 0:
            seq = prompt + a[:-1]
            theirs.reset()
            theirs.eval(seq)
            ref = load_model(args.folder, dtype=torch.float32).full_logits(torch.tensor([seq]))[0].numpy()
            print(
                f"  max |logit difference| over {len(seq)} positions: "
                f"{np.abs(np.array(theirs.scores[: len(seq)]) - ref).max():.2e} (logits up to {np.abs(ref).max():.1f})"
            )


if __name__ == "__main__":
    main()
