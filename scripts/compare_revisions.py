"""Greedy tokens and logprobs over the engine's configurations, written as JSON (floats as hex), so that two
checkouts can be compared bit for bit: a refactor that must not change behaviour gives the same file.

    PYTHONPATH=OLD python scripts/compare_revisions.py run old.json
    PYTHONPATH=NEW python scripts/compare_revisions.py run new.json
    python scripts/compare_revisions.py diff old.json new.json

Each checkout builds its own native kernels (LATENTKV_BUILD_DIR). The configurations: tiny DeepSeek-V2/V3
checkpoints (tests/tiny.py: dense, MoE, q_lora, YaRN) x float32 / bf16 x every latent cache format x the
linears (float, fixed-order, int4, w8a8) x the decode plan on and off (enforce_eager), a batch
of prompts with prefill, decode and prefix caching.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

from latentkv import LLM, SamplingParams
from latentkv.facts import CACHE_DTYPES

TESTS = Path(__file__).resolve().parent.parent / "tests"
MODELS = ("v2_dense", "v3_moe_sigmoid", "v3_yarn_halves_tied")
DTYPES = ("float32", "bfloat16")
LINEARS = (None, "fixed-order", "int4", "w8a8")
PROMPTS = ["the quick brown fox", "one two three four five six", "the quick brown fox jumps over", "héllo wörld"]


def record(outputs) -> list:
    rows = []
    for out in outputs:
        gen = out.outputs[0]
        logprobs = [
            sorted((int(k), float(getattr(v, "logprob", v)).hex()) for k, v in step.items())
            for step in (gen.logprobs or [])
        ]
        rows.append({"tokens": list(gen.token_ids), "logprobs": logprobs})
    return rows


def run(path: str) -> None:
    sys.path.insert(0, str(TESTS))
    import torch
    from tiny_lm import save_tiny_lm

    torch.manual_seed(0)
    results = {}
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, ignore_eos=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            folder = Path(tmp) / name
            save_tiny_lm(folder, name)
            for dtype, cache, linear, eager in itertools.product(DTYPES, CACHE_DTYPES, LINEARS, (False, True)):
                key = f"{name} {dtype} cache={cache} linears={linear or 'float'} eager={eager}"
                options = dict(
                    dtype=dtype,
                    kv_cache_dtype=cache,
                    block_size=4,
                    kv_cache_blocks=256,
                    enforce_eager=eager,
                    batch_invariant=linear == "fixed-order",
                    quantization=None if linear in (None, "fixed-order") else linear,
                )
                try:
                    llm = LLM(str(folder), **options)
                    results[key] = record(llm.generate(PROMPTS, params, use_tqdm=False))
                    results[key + " plan"] = llm.llm_engine.runner.plan is not None
                except Exception as err:  # a configuration refused is a result too
                    results[key] = f"error: {type(err).__name__}: {err}"
                print(key, "ok" if isinstance(results[key], list) else results[key], file=sys.stderr)
    Path(path).write_text(json.dumps(results, indent=0, sort_keys=True))


def diff(old: str, new: str) -> int:
    a, b = json.loads(Path(old).read_text()), json.loads(Path(new).read_text())
    keys = sorted(k for k in set(a) | set(b) if not k.endswith(" plan"))
    differ = [k for k in keys if a.get(k) != b.get(k)]
    differ += [k + " plan" for k in keys if a.get(k + " plan") != b.get(k + " plan")]
    runs = sum(isinstance(a.get(k), list) for k in keys)
    for k in differ:
        print("differs:", k)
    planned = sum(bool(a.get(k + " plan")) for k in keys)
    print(
        f"{len(keys)} configurations ({runs} ran, {planned} on the decode plan, {len(keys) - runs} refused): "
        f"{len(differ)} differ"
    )
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run").add_argument("out")
    d = sub.add_parser("diff")
    d.add_argument("old")
    d.add_argument("new")
    args = parser.parse_args()
    if args.command == "run":
        run(args.out)
        return 0
    return diff(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
