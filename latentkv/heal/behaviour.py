"""`eval chat` inside a heal: the student against the teacher on the held-out chat prompts
before, during (every `eval_every` steps, teacher-forced only) and after training.

The teacher's answer rows are scored once and kept (ChatModel memoize), so a periodic check
costs one student forward per prompt.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..plots import new_figure, save_figure
from ..sources.chat_data import load_chat
from ..eval.chat import ChatModel, chat_metrics, format_table, greedy_uncached, render_cases
from ..facts import TRANSFORM_CODE


def student_model(student, tokenizer, folder: Path) -> ChatModel:
    """The student as `eval chat` scores it. A transform-coded student already reads its latent through the
    codes (convert/simulated.py, the heal's loop): it is scored over a float cache and answers greedily by
    full forwards, never through the coded cache as well (that would quantize its latent twice)."""
    if not getattr(student, "simulated", False):
        return ChatModel.from_mla(student, tokenizer, str(folder))
    logits = lambda ids: student.full_logits(ids, cache_dtype="auto")  # noqa: E731
    stop = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    greedy = lambda prompts, limits: greedy_uncached(logits, prompts, limits, stop)  # noqa: E731
    name = "mla (latentkv model, transform-coded cache simulated)"
    return ChatModel(logits, tokenizer, name, str(folder), greedy, cache_dtype=TRANSFORM_CODE)


class ChatProbe:
    def __init__(self, student, tokenizer, folder: Path, teacher_logits, teacher: str | None, examples: int):
        self.cases = render_cases(tokenizer, load_chat(teacher, "heldout")[:examples])
        self.student = student_model(student, tokenizer, folder)
        self.reference = ChatModel(
            teacher_logits, tokenizer, "teacher", str(teacher or "bundled SmolLM2 GGUF"), memoize=True
        )
        self.curve: list[dict] = []  # {"step", "train_minutes", "top1_agreement", "kl", "match_mean"}
        self.seconds = 0.0  # spent measuring (not training)

    def measure(self, step: int, train_minutes: float, generate: bool = False, label: str = "") -> dict:
        started = time.monotonic()
        r = chat_metrics(self.student, self.reference, self.cases, generate=generate, desc=f"eval chat {label}".strip())
        self.seconds += time.monotonic() - started
        self.curve.append(
            {
                "step": step,
                "train_minutes": train_minutes,
                "top1_agreement": r["top1_agreement"],
                "kl": r["kl"],
                "match_mean": r["match_mean"],
            }
        )
        return r


def report(probe: ChatProbe, before: dict | None, after: dict, out: Path) -> str:
    """Write out/chat_eval.json and out/chat_agreement.png; returns the before/after tables."""
    strip = lambda r: r and {k: v for k, v in r.items() if k != "per_example"}  # noqa: E731
    (out / "chat_eval.json").write_text(
        json.dumps({"before": strip(before), "after": after, "curve": probe.curve}, indent=1)
    )
    if len(probe.curve) > 1:
        fig, ax = new_figure(
            "Healing: chat top-1 agreement with the original (held-out prompts)", "training minutes", "top-1 agreement"
        )
        ax.plot([c["train_minutes"] for c in probe.curve], [c["top1_agreement"] for c in probe.curve], marker="o")
        ax.axhline(0.95, linestyle="--", color="grey")
        save_figure(fig, out, "chat_agreement")
    parts = [] if before is None else ["eval chat before healing:", format_table(before)]
    return "\n".join(parts + ["eval chat after healing:", format_table(after)])
