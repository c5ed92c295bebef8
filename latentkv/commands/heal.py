"""`latentkv heal CONVERTED --teacher SOURCE --data FILES...`"""

from __future__ import annotations

import argparse

from latentkv.heal.trainer import HealConfig, heal


def register(subparsers) -> None:
    p = subparsers.add_parser("heal", help="distill a converted model back toward its original")
    p.add_argument("converted", help="a converted MLA folder (native or --stock)")
    p.add_argument("--teacher", help="the original model: GGUF file or HF folder (default: the bundled SmolLM2 GGUF)")
    p.add_argument(
        "--data",
        nargs="+",
        help="text / jsonl files or folders for the document part (default: the offline corpus's training split)",
    )
    p.add_argument(
        "--chat-share",
        type=float,
        default=0.5,
        help="share of the training tokens from the chat data's calib split (the teacher's own answers, "
        "through the chat template); 0: documents only",
    )
    p.add_argument(
        "--eval-examples", type=int, default=32, help="held-out chat prompts for eval chat before/after (0: none)"
    )
    p.add_argument("--eval-every", type=int, default=0, help="also eval chat (teacher-forced) every N steps")
    p.add_argument("--steps", type=int, help="optimizer steps")
    p.add_argument("--minutes", type=float, help="time budget; with --steps, whichever ends first")
    p.add_argument("--lr", type=float, default=HealConfig.lr, help=f"peak learning rate (default {HealConfig.lr})")
    p.add_argument("--warmup", type=int, default=20, help="warmup steps")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--train", choices=["attention", "all"], default="attention", help="which weights to train")
    p.add_argument("--lm-weight", type=float, default=0.0, help="mix in the language-model loss: (1-w)·KL + w·LM")
    p.add_argument("--save-every", type=int, default=50, help="checkpoint every N steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="output folder (default: CONVERTED-healed)")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    p.add_argument(
        "--autocast",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast (default: where bf16 is native: CUDA, CPUs with avx512_bf16 / AMX; "
        "elsewhere float32, as emulated bf16 is ~100x slower)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    cfg = HealConfig(
        converted=args.converted,
        teacher=args.teacher,
        data=args.data,
        out=args.out,
        steps=args.steps,
        minutes=args.minutes,
        lr=args.lr,
        warmup=args.warmup,
        seq_len=args.seq_len,
        batch=args.batch,
        train=args.train,
        lm_weight=args.lm_weight,
        save_every=args.save_every,
        seed=args.seed,
        resume=args.resume,
        autocast=args.autocast,
        chat_share=args.chat_share,
        eval_examples=args.eval_examples,
        eval_every=args.eval_every,
    )
    result = heal(cfg)
    print(f"heal: {result.steps_done} steps, {result.skipped} skipped; {result.stopped}; model in {result.out}")
    if result.losses:
        print(f"heal: loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}; curve in {result.out / 'loss_curve.png'}")
    if result.chat_table:
        print(result.chat_table)
        print(f"heal: {result.train_minutes:.1f} minutes training; chat eval in {result.out / 'chat_eval.json'}")
    return 0 if not result.stopped.startswith("stopped") else 1
