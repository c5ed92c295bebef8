"""Behaviour against the original model on chat prompts (`latentkv eval chat`).

Each example is a prompt rendered through the chat template with the ORIGINAL model's greedy
answer as the assistant turn (latentkv.sources.chat_data): ids [T], answer positions p in
[answer_start, T) — the answer's tokens, end-of-turn token included as the template writes it.
The model and the original each score the same ids once, teacher-forced; the logits at p-1
predict token p. Over all answer positions of all examples pooled:

- top-1 agreement = mean[ argmax model(p-1) == argmax original(p-1) ]  (the original computed
  in the same run, not read from the stored tokens, so near-ties are judged on equal terms);
- KL = mean KL(original(p-1) ‖ model(p-1)), nats per answer token.

Per example:
- match length = how many leading answer tokens ids[p] satisfy argmax model(p-1) == ids[p]: the
  length of the prefix the model's own greedy decode shares with the original's stored answer.
  Greedy decoding takes the argmax of exactly these logits, so counting teacher-forced is the
  same as generating and comparing (up to float noise between a full forward and cached decode).
  Reported as mean, median and the fraction of examples matched to the end ("full").
- degenerate: the model's greedy answer — the matched prefix, then its own greedy continuation
  up to len(answer) + extra_tokens tokens or an EOS — breaks the repetition rule
  (repetition.RULE). The same rule on the original's answers is reported beside it.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from latentkv.engine.args import EngineArgs
from latentkv.engine.engine import LLMEngine
from latentkv.engine.folder import load_tokenizer
from latentkv.eval.scorer import is_mla_folder
from latentkv.eval.repetition import RULE, distinct_ratio, is_degenerate
from latentkv.model.loader import load_model
from latentkv.sampling_params import SamplingParams
from latentkv.sources.chat_data import load_chat, render_chat_example
from latentkv.sources.readers import read_source
from latentkv.sources.reference import source_logits

EXTRA_TOKENS = 32  # greedy answers may run this far past the original's length (room to show a loop)


@dataclass(frozen=True)
class ChatCase:
    """One rendered example: ids [T] = prompt (with the template's control tokens) + answer."""

    id: str
    category: str
    ids: tuple[int, ...]
    answer_start: int

    @property
    def answer(self) -> list[int]:
        return list(self.ids[self.answer_start :])


def render_cases(tokenizer, examples) -> list[ChatCase]:
    """ChatCases of chat_data examples through the tokenizer's chat template."""
    cases = []
    for ex in examples:
        ids, start = render_chat_example(tokenizer, ex)
        if not 0 < start < len(ids):
            raise ValueError(f"chat example {ex.id}: answer_start {start} outside its {len(ids)} tokens")
        cases.append(ChatCase(ex.id, ex.category, tuple(ids), start))
    return cases


class ChatModel:
    """A model to compare: logits(ids [1, T]) -> [1, T, V] float32, and greedy decoding.

    MLA folders (ours or DeepSeek layout, native or stock, healed) run latentkv's model: the full
    forward for scoring and the engine (paged latent cache) for greedy answers. GGUF files and
    Llama-family HF folders run the converter's reference forward, decoding without a cache
    (sources are evaluated mostly as the reference itself, where little is generated).
    """

    def __init__(
        self,
        logits: Callable[[torch.Tensor], torch.Tensor],
        tokenizer,
        kind: str,
        name: str,
        greedy: Callable[[list[list[int]], list[int]], list[list[int]]] | None = None,
        memoize: bool = False,
        cache_dtype: str = "auto",
    ):
        self.logits, self.tokenizer, self.kind, self.name, self.greedy = logits, tokenizer, kind, name, greedy
        self.cache_dtype = cache_dtype  # the latent cache it scores through (MLA models)
        # a reference scored again and again (healing's periodic eval) keeps its answer rows:
        # [answer tokens, vocab] float32 per case
        self.memo: dict | None = {} if memoize else None

    @torch.inference_mode()
    def answer_logprobs(self, case: ChatCase) -> torch.Tensor:
        """[len(answer), V] log-probabilities of the rows predicting the answer (logits at p-1 for token p)."""
        if self.memo is not None and case.ids in self.memo:
            return self.memo[case.ids]
        rows = slice(case.answer_start - 1, len(case.ids) - 1)
        lp = F.log_softmax(self.logits(torch.tensor([case.ids]))[0, rows].float(), -1)
        if self.memo is not None:
            self.memo[case.ids] = lp
        return lp

    @classmethod
    def load(cls, path: str | Path | None, dtype: str = "float32", cache_dtype: str = "auto") -> "ChatModel":
        if path is not None and is_mla_folder(Path(path)):
            model = load_model(path, dtype=getattr(torch, dtype))
            return cls.from_mla(model, load_tokenizer(str(path)), str(path), cache_dtype)
        if cache_dtype != "auto" or dtype != "float32":
            raise ValueError("--cache-dtype and --dtype apply to MLA models only")
        src = read_source(path)
        tokenizer = src.tokenizer()
        eos = src.eos_token_id if isinstance(src.eos_token_id, list) else [src.eos_token_id]
        stop = sorted({t for t in [*eos, tokenizer.eos_token_id] if t is not None})
        logits = lambda ids: source_logits(src, ids)  # noqa: E731
        return cls(
            logits,
            tokenizer,
            f"source ({src.kind} {src.arch}, reference forward)",
            str(path or "bundled SmolLM2 GGUF"),
            lambda prompts, limits: greedy_uncached(logits, prompts, limits, stop),
        )

    @classmethod
    def from_mla(cls, model, tokenizer, folder: str, cache_dtype: str = "auto") -> "ChatModel":
        """Wrap a loaded latentkv model (e.g. one being healed) from `folder`; cache_dtype "auto" is the
        folder's own cache format, as served."""
        cache_dtype = model.config.served_cache_dtype(cache_dtype)
        return cls(
            lambda ids: model.full_logits(ids, cache_dtype=cache_dtype),
            tokenizer,
            "mla (latentkv model)",
            folder,
            lambda prompts, limits: greedy_engine(model, tokenizer, folder, cache_dtype, prompts, limits),
            cache_dtype=cache_dtype,
        )


def greedy_uncached(logits_fn, prompts: list[list[int]], limits: list[int], stop: list[int]) -> list[list[int]]:
    """Greedy continuations (at most limits[i] tokens, ending at a stop id) by full forwards."""
    outs = []
    for prompt, limit in zip(prompts, limits):
        ids, out = list(prompt), []
        while len(out) < limit:
            token = int(logits_fn(torch.tensor([ids]))[0, -1].argmax())
            out.append(token)
            ids.append(token)
            if token in stop:
                break
        outs.append(out)
    return outs


def greedy_engine(
    model, tokenizer, folder: str, cache_dtype: str, prompts: list[list[int]], limits: list[int]
) -> list[list[int]]:
    """Greedy continuations through latentkv's engine (batched, paged latent cache)."""
    if not prompts:
        return []
    longest = max(len(p) + n for p, n in zip(prompts, limits))
    args = EngineArgs(
        model=folder,
        dtype=str(model.dtype).removeprefix("torch."),
        kv_cache_dtype=cache_dtype,
        max_model_len=longest + 1,
        kv_cache_blocks=len(prompts) * (-(-(longest + 1) // 16) + 1),
        max_num_seqs=len(prompts),
        enable_prefix_caching=False,
    )
    engine = LLMEngine(args, model, tokenizer)
    for i, (prompt, limit) in enumerate(zip(prompts, limits)):
        engine.add_request(str(i), None, SamplingParams(temperature=0.0, max_tokens=limit), prompt_token_ids=prompt)
    outs: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = list(out.outputs[0].token_ids)
    engine.close()
    return [outs[str(i)] for i in range(len(prompts))]


@torch.inference_mode()
def score_case(model: ChatModel, reference: ChatModel, case: ChatCase) -> dict:
    """Teacher-forced comparison on one case: agreement count, KL sum, match length."""
    mine, ref = model.answer_logprobs(case), reference.answer_logprobs(case)
    top = mine.argmax(-1)
    agree = top == ref.argmax(-1)
    kl = (ref.exp() * (ref - mine)).sum(-1)
    hits = (top == torch.tensor(case.answer)).int()
    match = int(hits.cumprod(0).sum())
    return {
        "id": case.id,
        "category": case.category,
        "positions": len(case.answer),
        "agree": int(agree.sum()),
        "kl_sum": float(kl.sum()),
        "match": match,
        "next": int(top[match]) if match < len(case.answer) else None,
    }


def chat_metrics(
    model: ChatModel,
    reference: ChatModel,
    cases: list[ChatCase],
    generate: bool = True,
    extra_tokens: int = EXTRA_TOKENS,
    desc: str = "eval chat",
) -> dict:
    """Behaviour of `model` against `reference` on rendered cases (see the module docstring).

    Returns {"examples", "positions", "top1_agreement", "kl", "match_mean", "match_median",
    "full_match", "degenerate", "degenerate_reference", "rule", "by_category", "per_example"};
    with generate=False the greedy answers are not decoded and the degenerate counts are None.
    """
    if not cases:
        raise ValueError("no chat examples to evaluate")
    per = [score_case(model, reference, c) for c in tqdm(cases, desc=desc, unit="prompt", leave=False)]
    if generate:
        add_greedy_answers(model, cases, per, extra_tokens)
    result = summarize(per)
    result["rule"] = RULE
    result["by_category"] = {
        cat: summarize([p for p in per if p["category"] == cat]) for cat in sorted({p["category"] for p in per})
    }
    result["per_example"] = per
    return result


def add_greedy_answers(model: ChatModel, cases: list[ChatCase], per: list[dict], extra_tokens: int) -> None:
    """Each example's greedy answer (matched prefix + the model's own continuation) and its flags."""
    diverged = [i for i, p in enumerate(per) if p["next"] is not None]
    limits = {i: len(cases[i].answer) + extra_tokens - per[i]["match"] - 1 for i in diverged}
    todo = [i for i in diverged if limits[i] > 0]
    prompts = [list(cases[i].ids[: cases[i].answer_start + per[i]["match"]]) + [per[i]["next"]] for i in todo]
    continued = {i: [] for i in diverged} | dict(zip(todo, model.greedy(prompts, [limits[i] for i in todo])))
    for i, (case, p) in enumerate(zip(cases, per)):
        answer = case.answer if i not in continued else case.answer[: p["match"]] + [p["next"]] + continued[i]
        p["greedy_tokens"] = len(answer)
        p["greedy_text"] = model.tokenizer.decode(answer, skip_special_tokens=False)
        p["distinct2"] = distinct_ratio(answer)
        p["degenerate"] = is_degenerate(answer) is not None
        p["degenerate_reference"] = is_degenerate(case.answer) is not None


def summarize(per: list[dict]) -> dict:
    positions = sum(p["positions"] for p in per)
    matches = [p["match"] for p in per]
    generated = all("degenerate" in p for p in per)
    return {
        "examples": len(per),
        "positions": positions,
        "top1_agreement": sum(p["agree"] for p in per) / positions,
        "kl": sum(p["kl_sum"] for p in per) / positions,
        "match_mean": statistics.mean(matches),
        "match_median": statistics.median(matches),
        "full_match": sum(p["match"] == p["positions"] for p in per) / len(per),
        "degenerate": sum(p["degenerate"] for p in per) if generated else None,
        "degenerate_reference": sum(p["degenerate_reference"] for p in per) if generated else None,
    }


def format_table(result: dict) -> str:
    """Markdown table: one row per category and one for all examples."""
    head = (
        "| prompts | n | answer tokens | top-1 agreement | KL (nats/token) | match mean | match median | "
        "full match | degenerate (original) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    rows = [(cat, r) for cat, r in result["by_category"].items()] + [("**all**", result)]
    lines = [head]
    for name, r in rows:
        degenerate = "-" if r["degenerate"] is None else f"{r['degenerate']} ({r['degenerate_reference']})"
        lines.append(
            f"| {name} | {r['examples']} | {r['positions']} | {r['top1_agreement']:.4f} | {r['kl']:.4f} | "
            f"{r['match_mean']:.1f} | {r['match_median']:g} | {r['full_match']:.2f} | {degenerate} |"
        )
    return "\n".join(lines)


def print_degenerate(result: dict, file=sys.stdout) -> None:
    for p in result["per_example"]:
        if p.get("degenerate"):
            print(f"degenerate: {p['id']}: {p['greedy_text']!r}", file=file)


def evaluate_chat(
    model: str | Path | None,
    reference: str | Path | None = None,
    split: str = "heldout",
    max_examples: int | None = None,
    dtype: str = "float32",
    cache_dtype: str = "auto",
    generate: bool = True,
    extra_tokens: int = EXTRA_TOKENS,
) -> dict:
    """`latentkv eval chat`: load both models, render the reference's chat examples with the
    reference's tokenizer (control tokens included), and compare (chat_metrics)."""
    ref = ChatModel.load(reference)
    examples = load_chat(reference, split)[:max_examples]
    cases = render_cases(ref.tokenizer, examples)
    mine = (
        ref
        if model is not None and reference is not None and Path(model) == Path(reference)
        else ChatModel.load(model, dtype, cache_dtype)
    )
    if mine.tokenizer.get_vocab() != ref.tokenizer.get_vocab():
        raise ValueError(f"{mine.name} and the reference {ref.name} have different vocabularies")
    result = chat_metrics(mine, ref, cases, generate, extra_tokens)
    return {
        "model": f"{mine.name} [{mine.kind}]",
        "reference": f"{ref.name} [{ref.kind}]",
        "split": split,
        "dtype": dtype,
        "cache_dtype": mine.cache_dtype,
        **result,
    }
