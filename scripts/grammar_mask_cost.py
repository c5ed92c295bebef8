"""Per-token cost of a JSON-schema token mask at batch 32, for the grammar libraries
latentkv could use (xgrammar, llguidance, outlines-core), on the bundled SmolLM2's
tokenizer (49152 tokens). Each step: compute every sequence's allowed-token mask, apply
the 32 masks to a [32, vocab] logits tensor, pick a token per row (argmax of random
logits under the mask) and advance each matcher. Prints ms per step (all 32 rows) and
the one-off compile time. Usage: python scripts/grammar_mask_cost.py [steps]
"""

from __future__ import annotations

import json
import sys
import time

import torch

from latentkv.resolve import default_gguf_path

BATCH = 32
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "tags", "address"],
    "additionalProperties": False,
}


def tokenizer():
    from transformers import AutoTokenizer

    path = default_gguf_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def run(name, make, steps, vocab):
    t0 = time.perf_counter()
    fill, advance = make()
    compile_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps):
        logits = torch.randn(BATCH, vocab, generator=gen)
        t = time.perf_counter()
        fill(logits)
        tokens = logits.argmax(dim=-1).tolist()
        times.append(time.perf_counter() - t)
        if not advance(tokens):
            break
    times.sort()
    print(
        f"{name:14s} compile {compile_s * 1e3:8.1f} ms   mask+apply per step (32 rows): "
        f"median {times[len(times) // 2] * 1e3:6.2f} ms  p90 {times[int(len(times) * 0.9)] * 1e3:6.2f} ms  "
        f"({len(times)} steps)"
    )


def xgrammar_case(tok, vocab):
    import xgrammar as xgr

    def make():
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
        compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(BATCH)]
        bitmask = xgr.allocate_token_bitmask(BATCH, vocab)

        def fill(logits):
            for i, m in enumerate(matchers):
                m.fill_next_token_bitmask(bitmask, i)
            xgr.apply_token_bitmask_inplace(logits, bitmask)

        def advance(tokens):
            return all(m.accept_token(t) for m, t in zip(matchers, tokens)) and not any(
                m.is_terminated() for m in matchers
            )

        return fill, advance

    return make


def llguidance_case(tok, vocab):
    import llguidance
    import llguidance.hf
    import llguidance.torch as llt

    def make():
        lltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
        matchers = [llguidance.LLMatcher(lltok, grammar) for _ in range(BATCH)]
        bitmask = llt.allocate_token_bitmask(BATCH, vocab)

        def fill(logits):
            for i, m in enumerate(matchers):
                llt.fill_next_token_bitmask(m, bitmask, i)
            llt.apply_token_bitmask_inplace(logits, bitmask)

        def advance(tokens):
            for m, t in zip(matchers, tokens):
                m.consume_token(t)
            return not any(m.is_stopped() or m.is_error() for m in matchers)

        return fill, advance

    return make


def outlines_case(tok, vocab):
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    def make():
        eos = tok.eos_token_id
        # outlines-core wants the tokens' byte strings; from the byte-level BPE pieces
        decoder = {v: k for k, v in byte_level_alphabet().items()}
        pieces: dict = {}
        for piece, tid in tok.get_vocab().items():
            if tid == eos or tid >= vocab or piece in tok.all_special_tokens:
                continue
            try:
                key = bytes(decoder[c] for c in piece)
            except KeyError:
                continue
            pieces.setdefault(key, []).append(tid)
        index = Index(build_regex_from_schema(json.dumps(SCHEMA)), Vocabulary(eos, pieces))
        guides = [Guide(index) for _ in range(BATCH)]
        mask = torch.zeros(BATCH, (vocab + 31) // 32, dtype=torch.int32)

        def fill(logits):
            for i, g in enumerate(guides):
                g.write_mask_into(mask[i].data_ptr(), mask[i].numel(), mask.element_size())
            bits = (mask[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1
            logits.masked_fill_(bits.flatten(1)[:, :vocab] == 0, float("-inf"))

        def advance(tokens):
            for g, t in zip(guides, tokens):
                g.advance(t)
            return not any(g.is_finished() for g in guides)

        return fill, advance

    return make


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE pieces are written in it)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def main():
    torch.set_num_threads(1)
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    tok = tokenizer()
    vocab = len(tok)
    print(f"vocab {vocab}, batch {BATCH}, torch threads 1")
    for name, case in (("xgrammar", xgrammar_case), ("llguidance", llguidance_case), ("outlines-core", outlines_case)):
        try:
            run(name, case(tok, vocab), steps, vocab)
        except Exception as err:  # noqa: BLE001 - report and go on to the next library
            print(f"{name:14s} failed: {type(err).__name__}: {err}")


if __name__ == "__main__":
    main()
