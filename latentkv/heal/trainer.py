"""Distillation loop: KL from the teacher's next-token distribution (optionally mixed with
the language-model loss), AdamW with warmup + cosine decay, gradient clipping at 1.0,
a transform-coded folder's latent read through its codes (straight-through: convert/simulated.py),
bf16 autocast where bf16 is native (CUDA; CPUs with avx512_bf16 / AMX), a fixed seed, NaN/Inf steps
skipped, checkpoints that resume the same trajectory."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..plots import new_figure, save_figure
from ..cpu import native_bf16
from ..eval.chat import format_table
from ..sources.reference import source_logits
from ..sources.readers import read_source
from ..model.loader import load_model
from ..cache.transform_code import folder_code
from ..convert.simulated import simulate
from .checkpoint import input_dtype, load_state, save_model, save_state
from .behaviour import ChatProbe, report
from .windows import batch_indices, calib_chat, training_windows

ATTENTION_PARAMS = (".self_attn.",)
STATE_DIR = "training_state"  # beside the model files: what --resume needs
MASTER = "master_weights.safetensors"


@dataclass
class HealConfig:
    converted: str
    teacher: str | None = None  # the original model (GGUF / HF folder); None: the bundled SmolLM2
    data: list[str] | None = None  # text / jsonl files or folders; None: the default corpus's training split
    out: str | None = None  # default: <converted>-healed
    steps: int | None = None
    minutes: float | None = None
    # measured on the -50% SmolLM2 (docs/conversion.md, "Healing"): at 1e-4 held-out chat agreement
    # first fell (0.686 -> 0.673 at step 30) and was 0.769 after 30 minutes; 3e-5: 0.745 at step 30, 0.793
    lr: float = 3e-5
    warmup: int = 20
    seq_len: int = 256
    batch: int = 4
    train: str = "attention"  # "attention" | "all"
    lm_weight: float = 0.0  # loss = (1 - w)·KL + w·LM
    save_every: int = 50
    max_bad_steps: int = 5
    seed: int = 0
    resume: bool = False
    # bf16 autocast; master weights stay float32. None: where bf16 runs natively (CUDA, or a CPU with
    # avx512_bf16 / AMX: cpu.native_bf16). On an AVX2-only CPU bf16 matmuls are emulated (~1.2 GFLOP/s
    # against 116 in float32): a heal step of the bundled model took 278 s there instead of seconds.
    autocast: bool | None = None
    max_tokens: int = 4_000_000  # cap on training text tokenized up front
    chat_share: float = 0.5  # of the training tokens: the chat data's calib split (0: documents only)
    eval_examples: int = 32  # held-out chat prompts measured before/after (0: no chat eval)
    eval_every: int = 0  # also measure (teacher-forced) every N steps; 0: before and after only

    def validate(self) -> None:
        if self.steps is None and self.minutes is None:
            raise ValueError("give --steps or --minutes (or both: whichever ends first)")
        if self.train not in ("attention", "all"):
            raise ValueError(f"train must be 'attention' or 'all', got {self.train!r}")
        if not 0.0 <= self.chat_share <= 1.0:
            raise ValueError(f"chat_share must be in [0, 1], got {self.chat_share}")
        if self.eval_examples < 0 or self.eval_every < 0:
            raise ValueError("eval_examples and eval_every must be >= 0")
        if not 0.0 <= self.lm_weight <= 1.0:
            raise ValueError(f"lm_weight must be in [0, 1], got {self.lm_weight}")
        for name in ("seq_len", "batch", "save_every", "max_bad_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


@dataclass
class HealResult:
    out: Path
    steps_done: int
    losses: list[float] = field(default_factory=list)
    kls: list[float] = field(default_factory=list)
    skipped: int = 0
    stopped: str = "done"
    chat_before: dict | None = None  # eval chat (latentkv.eval.chat) on the held-out prompts
    chat_after: dict | None = None
    chat_curve: list[dict] = field(default_factory=list)
    chat_table: str = ""
    train_minutes: float = 0.0  # this run's wall time training (eval chat checks excluded)


def learning_rate(step: int, total: int, warmup: int, peak: float) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def distill_loss(student_logits, teacher_logits, ids, lm_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (loss, KL). KL(teacher ‖ student) per token over all positions; LM loss on next tokens."""
    s = F.log_softmax(student_logits.float(), dim=-1).flatten(0, 1)
    t = F.log_softmax(teacher_logits.float(), dim=-1).flatten(0, 1)
    kl = F.kl_div(s, t, log_target=True, reduction="batchmean")
    if lm_weight == 0:
        return kl, kl
    lm = F.cross_entropy(student_logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    return (1 - lm_weight) * kl + lm_weight * lm, kl


def select_trainable(model, train: str) -> list[torch.nn.Parameter]:
    params = []
    for name, p in model.named_parameters():
        p.requires_grad_(train == "all" or any(k in name for k in ATTENTION_PARAMS))
        if p.requires_grad:
            params.append(p)
    return params


def make_teacher(path: str | None, vocab: int):
    src = read_source(path)
    if src.vocab_size != vocab:
        raise ValueError(f"the teacher's vocabulary ({src.vocab_size}) differs from the converted model's ({vocab})")

    @torch.inference_mode()
    def logits(ids: torch.Tensor) -> torch.Tensor:
        return source_logits(src, ids)

    return logits


def heal(cfg: HealConfig, on_loss: Callable[[int, torch.Tensor], torch.Tensor] | None = None) -> HealResult:
    """Run (or resume) a healing run; `on_loss(step, loss)` may replace the loss (fault injection in tests)."""
    from transformers import AutoTokenizer

    cfg.validate()
    source, out = Path(cfg.converted), Path(cfg.out or f"{cfg.converted.rstrip('/')}-healed")
    torch.manual_seed(cfg.seed)
    dtype = input_dtype(source)
    student = load_model(out if cfg.resume else source, torch.float32).train()
    code = folder_code(student.config)
    if code is not None:  # a transform-coded folder: it trains on the latent its cache gives back
        simulate(student, code)
        tqdm.write(f"heal: the latent read through the folder's cache format ({code.describe()}), straight-through")
    params = select_trainable(student, cfg.train)
    teacher = make_teacher(cfg.teacher, student.config.vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(source)
    budget = (cfg.steps or 10**9) * cfg.batch * cfg.seq_len
    chat = calib_chat(cfg.teacher) if cfg.chat_share > 0 else None
    windows = training_windows(
        tokenizer, cfg.data, cfg.seq_len, min(budget, cfg.max_tokens), cfg.seed, chat, cfg.chat_share
    )
    probe = (
        ChatProbe(student, tokenizer, source, teacher, cfg.teacher, cfg.eval_examples) if cfg.eval_examples else None
    )
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    counters = {"step": 0, "total": cfg.steps, "skipped": 0, "losses": [], "kls": []}
    if cfg.resume:
        counters = load_state(out / STATE_DIR, optimizer)
        restore_master_weights(student, out / STATE_DIR)
    before = probe.measure(counters["step"], 0.0, generate=True, label="before") if probe else None
    if before:
        tqdm.write(f"heal: eval chat before healing ({len(probe.cases)} held-out prompts):\n{format_table(before)}")
    result = train_loop(cfg, student, params, teacher, windows, optimizer, counters, source, out, dtype, on_loss, probe)
    plot_curve(result, out)
    if probe:
        result.chat_before = before
        result.chat_after = probe.measure(result.steps_done, result.train_minutes, generate=True, label="after")
        result.chat_curve = probe.curve
        result.chat_table = report(probe, before, result.chat_after, out)
    return result


def train_loop(
    cfg, student, params, teacher, windows, optimizer, counters, source, out, dtype, on_loss, probe=None
) -> HealResult:
    result = HealResult(out, counters["step"], counters["losses"], counters["kls"], counters["skipped"])
    deadline = time.monotonic() + 60 * cfg.minutes if cfg.minutes else None
    bad_in_row, start_step, started = 0, counters["step"], time.monotonic()
    total = counters["total"] or cfg.steps
    bar = tqdm(total=total, initial=start_step, desc="heal", unit="step", dynamic_ncols=True)
    step = start_step
    while total is None or step < total:
        if deadline and time.monotonic() > deadline:
            result.stopped = "time budget reached"
            break
        done = step - start_step
        if cfg.steps is None and done >= 3 and done % 10 == 3:
            # --minutes only: size the schedule from the measured speed, and again every 10
            # steps, so a machine that gets busier still ends its cosine at the deadline
            per_step = (time.monotonic() - started) / done
            total = counters["total"] = step + max(1, int((deadline - time.monotonic()) / per_step))
            bar.total = total
        ids = windows[batch_indices(step, cfg.batch, len(windows), cfg.seed)]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, total or 10**6, cfg.warmup, cfg.lr)
        loss, kl = run_step(cfg, student, params, teacher, ids, optimizer, step, on_loss)
        if loss is None:
            result.skipped += 1
            bad_in_row += 1
            tqdm.write(f"heal: step {step}: NaN/Inf in the loss or gradients, step skipped ({bad_in_row} in a row)")
            if bad_in_row > cfg.max_bad_steps:
                result.stopped = (
                    f"stopped: more than {cfg.max_bad_steps} NaN/Inf steps in a row; the last good checkpoint is kept"
                )
                break
        else:
            bad_in_row = 0
            result.losses.append(loss)
            result.kls.append(kl)
        step += 1
        result.steps_done = step
        elapsed = time.monotonic() - started
        bar.update(1)
        bar.set_postfix(
            loss=f"{result.losses[-1]:.4f}" if result.losses else "-",
            kl=f"{result.kls[-1]:.4f}" if result.kls else "-",
            tok_s=f"{(step - start_step) * cfg.batch * cfg.seq_len / elapsed:.0f}",
        )
        if step % cfg.save_every == 0 or step == total:
            checkpoint(student, source, out, dtype, optimizer, result, total)
        if probe and cfg.eval_every and step % cfg.eval_every == 0 and step != total:
            measured = time.monotonic()
            r = probe.measure(step, (measured - started) / 60)
            tqdm.write(
                f"heal: step {step}: chat top-1 agreement {r['top1_agreement']:.4f}, KL {r['kl']:.4f}, "
                f"match mean {r['match_mean']:.1f}"
            )
            paused = time.monotonic() - measured  # measuring is not training: the clock and budget skip it
            started += paused
            deadline = deadline + paused if deadline else None
    bar.close()
    if result.stopped == "time budget reached":
        checkpoint(student, source, out, dtype, optimizer, result, total)
    result.train_minutes = (time.monotonic() - started) / 60
    return result


def use_autocast(setting: bool | None, device_type: str) -> bool:
    """HealConfig.autocast resolved for a device: None is True on CUDA, native_bf16() on CPU."""
    if setting is not None:
        return setting
    return device_type == "cuda" or (device_type == "cpu" and native_bf16())


def run_step(cfg, student, params, teacher, ids, optimizer, step, on_loss):
    """One optimizer step; returns (loss, kl) or (None, None) when it was skipped."""
    device_type = student.device.type
    with torch.enable_grad():  # callers may have autograd off (e.g. inside a bench)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=use_autocast(cfg.autocast, device_type)):
            logits = student.forward_sequences(ids)
        loss, kl = distill_loss(logits, teacher(ids), ids, cfg.lm_weight)
        if on_loss is not None:
            loss = on_loss(step, loss)
        optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            return None, None
        loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    if not torch.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        return None, None
    optimizer.step()
    return float(loss.detach()), float(kl.detach())


def checkpoint(student, source, out, dtype, optimizer, result: HealResult, total) -> None:
    """The model folder (loadable as is) plus out/training_state/ for --resume."""
    save_model(student, source, out, dtype)
    (out / STATE_DIR).mkdir(exist_ok=True)
    save_master_weights(student, out / STATE_DIR)
    save_state(
        out / STATE_DIR,
        optimizer,
        {
            "step": result.steps_done,
            "total": total,
            "skipped": result.skipped,
            "losses": result.losses,
            "kls": result.kls,
        },
    )


def save_master_weights(model, out: Path) -> None:
    """float32 copies of the trained parameters, so a resume is exact even when the
    checkpoint itself is stored in bfloat16."""
    from safetensors.torch import save_file

    tensors = {n: p.detach().float().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    save_file(tensors, str(out / MASTER))


def restore_master_weights(model, out: Path) -> None:
    from safetensors.torch import load_file

    master = load_file(str(out / MASTER))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in master.items():
            params[name].copy_(value)


def plot_curve(result: HealResult, out: Path) -> None:
    if not result.losses:
        return
    fig, ax = new_figure("Healing: distillation loss", "step", "loss / KL")
    ax.plot(result.losses, label="loss")
    ax.plot(result.kls, label="KL(teacher ‖ student)")
    save_figure(fig, out, "loss_curve")
