"""Chat data: instructions written into the repo and the original model's own greedy answers.

`assets/chat_prompts.jsonl` holds a few hundred instructions (facts, arithmetic, writing, code,
translation, lists, how-to, definitions, reasoning), each in a fixed split by a hash of its id:
"heldout" (one in HELDOUT_EVERY; conversion and healing never see it, `eval chat` measures on
it) or "calib". The answers are the *source model's* (self-distillation): greedy, float32, at
most MAX_NEW_TOKENS, stored as JSONL whose header names the source's content hash. An answer
file is used only for the source it was made from: the bundled files under `assets/` first, then
the user cache (`~/.cache/latentkv/chat/`); otherwise the answers are generated (minutes) and
cached — never another model's answers.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import torch
from tqdm.auto import tqdm

from latentkv.engine.chat_template import render_chat
from latentkv.facts import MLA_MODEL_TYPES
from latentkv.llm import LLM
from latentkv.sampling_params import SamplingParams
from latentkv.sources.readers import default_gguf_path, read_source
from latentkv.user_cache import cache_root, content_hash

ASSETS = Path(__file__).parent.parent / "assets"  # latentkv/assets: the package's data files
PROMPTS_FILE = ASSETS / "chat_prompts.jsonl"
BUNDLED_ANSWERS = ASSETS / "chat_answers-smollm2-135m.jsonl"  # the bundled SmolLM2's
HELDOUT_EVERY = 4  # one prompt in four (by id hash) is held out
MAX_NEW_TOKENS = 128
FORMAT = "latentkv chat answers v1"
SPLITS = ("calib", "heldout")


@dataclass(frozen=True)
class ChatExample:
    """One instruction and the source model's greedy answer.

    answer_ids: the answer's token ids as the source generated them (the source's tokenizer),
    ending with its end-of-turn token when `finished` (else cut at MAX_NEW_TOKENS)."""

    prompt: str
    answer: str
    id: str
    category: str
    answer_ids: tuple[int, ...] = ()
    finished: bool = True


def split_of(example_id: str) -> str:
    """ "heldout" or "calib", fixed by a hash of the id."""
    return "heldout" if int(hashlib.sha256(example_id.encode()).hexdigest(), 16) % HELDOUT_EVERY == 0 else "calib"


def load_prompts(split: str | None = None) -> list[dict]:
    """The prompt records {"id", "category", "prompt", "split"} (one split, or all)."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rows = [json.loads(line) for line in PROMPTS_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if split is None or r["split"] == split]


def prompts_digest() -> str:
    """Hash of the prompt file: answers made for other prompts are not used."""
    return hashlib.sha256(PROMPTS_FILE.read_bytes()).hexdigest()[:16]


def source_path(source) -> Path:
    """The source's file or folder (None: the bundled SmolLM2 GGUF)."""
    return default_gguf_path() if source is None else Path(source).expanduser()


def user_message(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def render_chat_example(tokenizer, example: ChatExample) -> tuple[list[int], int]:
    """(token_ids, answer_start): the templated conversation — control tokens, the user turn, the
    assistant header — then the answer; positions answer_start .. len-1 are the answer, so
    logits[answer_start-1 : len-1] predict it. Rendered through `tokenizer`'s chat template
    (engine/chat_template.py). The answer is the source's own tokens when the example carries
    them (its end-of-turn token included when finished); otherwise the template's rendering of
    the assistant turn (its end-of-turn markers included), or, for a template that renders the
    last turn differently from its generation prompt, the answer's tokens after the prompt."""
    _, prompt_ids = render_chat(tokenizer, user_message(example.prompt))
    if example.answer_ids:
        return prompt_ids + list(example.answer_ids), len(prompt_ids)
    turns = user_message(example.prompt) + [{"role": "assistant", "content": example.answer}]
    _, full = render_chat(tokenizer, turns, add_generation_prompt=False)
    if full[: len(prompt_ids)] == prompt_ids and len(full) > len(prompt_ids):
        return full, len(prompt_ids)
    return prompt_ids + tokenizer(example.answer, add_special_tokens=False).input_ids, len(prompt_ids)


# -- the answer files -----------------------------------------------------------------------
def read_answers(path: Path) -> tuple[dict, list[dict]]:
    """(header, rows) of an answer file."""
    lines = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines or lines[0].get("format") != FORMAT:
        raise ValueError(f"{path}: not a latentkv chat answer file (first line must have format {FORMAT!r})")
    return lines[0], lines[1:]


def matches(header: dict, fingerprint: str, max_new_tokens: int) -> bool:
    return (
        header.get("fingerprint") == fingerprint
        and header.get("prompts") == prompts_digest()
        and header.get("max_new_tokens") == max_new_tokens
    )


def answers_file(source=None, max_new_tokens: int = MAX_NEW_TOKENS, log=None) -> Path:
    """The answer file made from this source (bundled or cached), generated and cached if none is."""
    path = source_path(source)
    fingerprint = content_hash(path)
    cached = cache_root() / "chat" / f"answers-{fingerprint[:24]}-{max_new_tokens}.jsonl"
    for candidate in [*sorted(ASSETS.glob("chat_answers-*.jsonl")), cached]:
        if candidate.is_file() and matches(read_answers(candidate)[0], fingerprint, max_new_tokens):
            return candidate
    (log or (lambda m: print(m, file=sys.stderr, flush=True)))(
        f"latentkv: generating the chat answers of {path} (once; cached at {cached})"
    )
    return write_answers(path, cached, max_new_tokens, fingerprint)


@lru_cache(maxsize=4)
def _examples(path: Path, mtime: int) -> tuple[tuple[str, ChatExample], ...]:
    """(split, example) of every row of an answer file (read once per file version)."""
    return tuple(
        (
            r["split"],
            ChatExample(
                prompt=r["prompt"],
                answer=r["answer"],
                id=r["id"],
                category=r["category"],
                answer_ids=tuple(r["answer_ids"]),
                finished=r["finished"],
            ),
        )
        for r in read_answers(path)[1]
    )


def load_chat(source=None, split: str = "heldout", max_new_tokens: int = MAX_NEW_TOKENS) -> list[ChatExample]:
    """The chat examples of one split ("heldout" or "calib") with `source`'s own answers
    (None: the bundled SmolLM2; a GGUF, a Llama-family HF folder or an MLA folder)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    path = answers_file(source, max_new_tokens)
    return [e for s, e in _examples(path, path.stat().st_mtime_ns) if s == split]


def calibration_examples() -> list[ChatExample]:
    """The calibration split with the bundled SmolLM2's answers as text (no token ids), for any
    source's calibration: rendered through that source's own template, the conversations put its
    control tokens, user turns and an assistant voice in the statistics without generating
    anything first (for the bundled model they are its own answers). Never the held-out split."""
    path = BUNDLED_ANSWERS
    return [replace(e, answer_ids=()) for s, e in _examples(path, path.stat().st_mtime_ns) if s == "calib"]


# -- generating answers ----------------------------------------------------------------------
def is_mla_folder(path: Path) -> bool:
    cfg = path / "config.json"
    return path.is_dir() and cfg.is_file() and json.loads(cfg.read_text()).get("model_type") in MLA_MODEL_TYPES


def write_answers(
    source: Path, out: Path, max_new_tokens: int = MAX_NEW_TOKENS, fingerprint: str | None = None, batch: int = 32
) -> Path:
    """Let `source` answer every prompt greedily in float32 and write the answer file `out`
    (atomically). An MLA folder runs on latentkv's engine; a GGUF / Llama-family HF folder on
    transformers (the engine serves MLA only)."""
    source = Path(source)
    prompts = load_prompts()
    if is_mla_folder(source):
        generator, answers = "latentkv", engine_answers(source, prompts, max_new_tokens)
    else:
        generator, answers = "transformers", transformers_answers(source, prompts, max_new_tokens, batch)
    header = {
        "format": FORMAT,
        "source": source.name,
        "fingerprint": fingerprint or content_hash(source),
        "prompts": prompts_digest(),
        "max_new_tokens": max_new_tokens,
        "dtype": "float32",
        "decoding": "greedy",
        "generator": generator,
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for r, (text, ids, finished) in zip(prompts, answers):
            f.write(
                json.dumps(
                    {
                        "id": r["id"],
                        "category": r["category"],
                        "split": r["split"],
                        "prompt": r["prompt"],
                        "answer": text,
                        "answer_ids": ids,
                        "finished": finished,
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )
    tmp.replace(out)
    return out


def engine_answers(folder: Path, prompts: list[dict], max_new_tokens: int) -> list[tuple[str, list[int], bool]]:
    """[(text, token ids, finished)] from latentkv's own engine (float32, greedy, batched)."""
    llm = LLM(str(folder), dtype="float32", kv_cache_dtype="auto")
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0.0)
    outs = llm.generate([render_chat(tokenizer, user_message(r["prompt"]))[1] for r in prompts], params)
    return [(o.outputs[0].text, list(o.outputs[0].token_ids), o.outputs[0].finish_reason == "stop") for o in outs]


@torch.no_grad()
def transformers_answers(
    source: Path, prompts: list[dict], max_new_tokens: int, batch: int
) -> list[tuple[str, list[int], bool]]:
    """[(text, token ids, finished)] from transformers' float32 model of a GGUF / HF source
    (the same logits as the converter's reference forward), batched with left padding (masked: each
    answer is the one the prompt alone gets, up to float rounding)."""
    from transformers import AutoModelForCausalLM  # heavy: only when answers must be generated

    src = read_source(source)
    tokenizer = src.tokenizer()
    if src.kind == "gguf":
        model = AutoModelForCausalLM.from_pretrained(str(src.path.parent), gguf_file=src.path.name, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(src.path), dtype=torch.float32)
    model.eval()
    eos = set(
        model.generation_config.eos_token_id
        if isinstance(model.generation_config.eos_token_id, list)
        else [model.generation_config.eos_token_id]
    )
    eos = sorted(t for t in eos | {tokenizer.eos_token_id} if t is not None)
    ids = [render_chat(tokenizer, user_message(r["prompt"]))[1] for r in prompts]
    # rows of one category tend to stop together (HF generate runs until every row has), and
    # similar lengths pad little
    order = sorted(range(len(prompts)), key=lambda i: (prompts[i]["category"], len(ids[i])))
    answers: list = [None] * len(prompts)
    for k in tqdm(range(0, len(order), batch), desc="answering (transformers, greedy)", unit="batch"):
        chunk = order[k : k + batch]
        width = max(len(ids[i]) for i in chunk)
        x = torch.tensor([[eos[0]] * (width - len(ids[i])) + ids[i] for i in chunk])  # left padding, masked
        mask = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i in chunk])
        out = model.generate(
            x,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0],
        )
        for i, row in zip(chunk, out[:, width:].tolist()):
            stop = next((j for j, t in enumerate(row) if t in eos), None)
            row = row if stop is None else row[: stop + 1]
            answers[i] = (tokenizer.decode(row, skip_special_tokens=True), row, stop is not None)
    return answers
