"""Per-linear speed of latentkv's fixed-order linear (kernels/qlinear.py) against MKL's F.linear.

For each shape (N, K) and row count M: the kernel (float32 weights, and int4 / int8 with --kinds)
and F.linear on the same x, interleaved, `--repeats` rounds; prints median GFLOP/s and the ratio
kernel / F.linear. Pin it and give it one thread for the figures we quote:

    OMP_NUM_THREADS=1 taskset -c 1 python scripts/bench_qlinear.py

--prefill T instead times the bundled model's prefill of a T-token prompt (LLM.generate,
max_tokens=1, prefix caching off; --quantization int4 for int4 linears): median tokens/s.

--so PATH loads another build of the extension (e.g. a saved copy of the old one) in place of the
checkout's: A/B two builds in two processes (same-named extensions interpose their symbols).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch
import torch.nn.functional as F

from latentkv import LLM, SamplingParams
from latentkv.kernels import qlinear
from latentkv.kernels.build import NONE, Capabilities, allowed_caps, best_path
from latentkv.model.quant import quantize_int4, quantize_int8
from latentkv.resolve import resolve_model

# SmolLM2-135M converted to MLA (hidden 576, intermediate 1536): (name, N, K)
# (the bundled conversion: q 1314 + kv_a 336 fused, kv rank 240)
SHAPES = [
    ("qkv_a", 1650, 576),
    ("o", 576, 576),
    ("gate_up", 3072, 576),
    ("down", 576, 1536),
    ("kv_b", 1026, 240),
    ("lm_head", 49152, 576),
]


def load_so(path: str) -> None:
    spec = importlib.util.spec_from_file_location("latentkv_qlinear", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # the checkout's build never loads: no self-check here (a build from before named capabilities,
    # which took an ISA code, cannot be loaded this way)
    cpu = Capabilities.of_mask(module.cpu_capabilities())
    paths = {"scalar": NONE, **{path: Capabilities.of_mask(mask) for path, mask in module.paths()}}
    caps = allowed_caps(cpu)
    runs = [path for path, needs in paths.items() if needs <= cpu]
    qlinear.EXT.state.update(
        module=module, reason=None, cpu=cpu, paths=paths, runs=runs, disabled={}, caps=caps, path=best_path(paths, caps)
    )


def packed(bits: int, w: torch.Tensor) -> torch.Tensor:
    if bits == 32:
        return qlinear.pack_f32(w)
    if bits == 4:
        return qlinear.pack_int4(*quantize_int4(w))
    return qlinear.pack_int8(*quantize_int8(w))


def timed(fn, reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def prefill(tokens: int, repeats: int, quantization: str | None) -> None:
    llm = LLM(model=str(resolve_model(None).path), enable_prefix_caching=False, quantization=quantization)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    gen = torch.Generator().manual_seed(0)
    rates = []
    for i in range(repeats + 1):  # the first: warm-up
        ids = torch.randint(100, 40000, (tokens,), generator=gen).tolist()
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        if i:
            rates.append(tokens / (time.perf_counter() - start))
    print(
        f"prefill {tokens} tokens, quantization {quantization}: {statistics.median(rates):.1f} tok/s "
        f"(runs {', '.join(f'{r:.1f}' for r in rates)})",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--so")
    ap.add_argument("--m", default="1,4,64,512,2048")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    ap.add_argument("--kinds", default="32")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--flop", type=float, default=2e8, help="work per timed call, to pick inner reps")
    ap.add_argument("--prefill", type=int)
    ap.add_argument("--quantization")
    args = ap.parse_args()
    if args.so:
        load_so(args.so)
    if args.prefill:
        return prefill(args.prefill, args.repeats, args.quantization)
    print(f"threads {torch.get_num_threads()}, path {qlinear.EXT.choose() if qlinear.available() else None}")
    names = args.shapes.split(",")
    for name, n, k in SHAPES:
        if name not in names:
            continue
        w = torch.randn(n, k) * 0.05
        for bits in map(int, args.kinds.split(",")):
            p = packed(bits, w)
            for m in map(int, args.m.split(",")):
                x = torch.randn(m, k)
                flop = 2.0 * m * n * k
                reps = max(1, int(args.flop / flop))

                def kern():
                    return qlinear.linear(x, p, bits, n)

                def mkl():
                    return F.linear(x, w)

                kern(), mkl()
                tk, tm = [], []
                for _ in range(args.repeats):
                    tk.append(timed(kern, reps))
                    tm.append(timed(mkl, reps))
                gk, gm = flop / statistics.median(tk) / 1e9, flop / statistics.median(tm) / 1e9
                ratios = [b / a for a, b in zip(tk, tm)]
                print(
                    f"{name:8s} N={n:5d} K={k:4d} kind={bits:2d} M={m:5d}  kernel {gk:6.1f}  mkl {gm:6.1f} GFLOP/s"
                    f"  kernel/mkl {statistics.median(ratios):.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
