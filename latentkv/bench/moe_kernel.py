"""`latentkv bench kernel --moe DxIxExK+S`: one MoE layer's experts alone, the native call
(kernels/qlinear.py `moe`) against the per-expert loop over the same packed linears
(model/deepseek.py moe_reference: a Python loop over the experts a batch routes to, each expert's
linears one kernel call; what MoE layers ran before the native call), in the same run: ms per call
and GB/s of expert weights read, by batch and weight kind.

The shape is hidden D x expert width I x routed experts E x experts per token k + shared experts S
(DeepSeek-V2-Lite: 2048x1408x64x6+2). The layer is built as a model builds it (model/route.py for the
weight kind, random weights packed by pack_weights); the router is left out (it stays in float32
and is the same in both). Each call routes its tokens anew (k distinct random experts per token,
from a list cycled through), so successive calls read different experts, as a model's successive
layers do; bytes read = the packed records of the distinct experts a call routes to, plus the
shared experts'. Successive calls also run on different layers (as many, built alike, as hold twice
the last-level cache, bench/bandwidth.py llc_bytes): one layer called over and over would be read from
L3 (480 MiB on the AMX Xeon: a V3-mini-shaped layer ran twice as fast there as cycled through 14).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import cpu
from ..config import ModelConfig
from ..facts import dtype_name
from ..kernels import qlinear
from ..model.deepseek import MoE, moe_reference
from ..model.footprint import param_dtype
from ..model.loader import resolve_dtype
from ..model.route import decide_route
from .bandwidth import llc_bytes
from .report import median, print_table, write_json

ROUTINGS = 16  # routings cycled through per configuration
MAX_LAYERS = 32  # layers cycled through at most
# --moe-weights -> (activation dtype: None for the machine's auto dtype, quantization or None for fixed-order)
WEIGHT_KINDS = {
    "float32": (torch.float32, None),
    "bf16": (torch.bfloat16, None),
    "int8": (None, "int8"),
    "int4": (None, "int4"),
    "w8a8": (None, "w8a8"),
    "w4a8": (None, "w4a8"),
}
SHAPE = re.compile(r"(\d+)x(\d+)x(\d+)x(\d+)(?:\+(\d+))?")


def parse_shape(text: str) -> tuple[int, int, int, int, int]:
    """ "2048x1408x64x6+2" -> (D, I, E, k, S); S defaults to 0."""
    match = SHAPE.fullmatch(text)
    if not match:
        raise SystemExit(f"--moe {text!r}: expected DxIxExK+S, e.g. 2048x1408x64x6+2 (DeepSeek-V2-Lite)")
    d, inter, experts, k, shared = (int(g or 0) for g in match.groups())
    if min(d, inter, experts, k) < 1 or k > experts:
        raise SystemExit(f"--moe {text!r}: sizes must be positive and k at most the number of experts")
    return d, inter, experts, k, shared


@torch.no_grad()
def build_layer(
    d: int, inter: int, experts: int, k: int, shared: int, dtype: torch.dtype, quantization: str | None, seed: int = 0
) -> MoE:
    """The layer as the route builds it for this weight kind, random weights, packed."""
    cfg = ModelConfig.from_dict(
        dict(
            model_type="deepseek_v2",
            vocab_size=128,
            hidden_size=d,
            intermediate_size=inter,
            num_hidden_layers=2,
            num_attention_heads=1,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=8,
            moe_intermediate_size=inter,
            n_routed_experts=experts,
            n_shared_experts=shared,
            num_experts_per_tok=k,
            first_k_dense_replace=1,
        )
    )
    route = decide_route("cpu", dtype, "torch", quantization, batch_invariant=quantization is None)
    with torch.device("meta"):
        layer = MoE(cfg, route)
    layer.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    for name, p in layer.named_parameters():  # in the dtype a checkpoint loads it in (the router float32)
        p.data = (torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5).to(param_dtype(f".mlp.{name}", dtype))
    layer.pack_weights()
    if layer.native is None:
        raise SystemExit(
            f"latentkv bench kernel --moe: the native call does not run here ({qlinear.unavailable_reason()})"
        )
    return layer


def routings(tokens: int, experts: int, k: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """ROUTINGS (weights [T, k] float32, ids [T, k]) with k distinct random experts per token."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(ROUTINGS):
        weights, ids = torch.rand(tokens, experts, generator=gen).topk(k, dim=-1)
        out.append((weights / weights.sum(-1, keepdim=True), ids))
    return out


def timed(fn, calls: int) -> float:
    """Seconds per call of `calls` back-to-back calls fn(i)."""
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls


def layer_bytes(layer: MoE) -> int:
    """Bytes of a layer's packed experts, routed and shared."""
    return sum(t.numel() * t.element_size() for t in layer.native[:4] if t is not None)


def measure(layers: list[MoE], tokens: int, args, dtype: torch.dtype, seed: int) -> dict:
    layer = layers[0]
    gate_up, down, shared_gate_up, shared_down = layer.native[:4]
    per_expert = (gate_up[0].numel() + down[0].numel()) * 4
    shared = sum(t.numel() * 4 for t in (shared_gate_up, shared_down) if t is not None)
    routes = routings(tokens, gate_up.shape[0], layer.gate.cfg.num_experts_per_tok, seed)
    x = torch.randn(tokens, layer.gate.weight.shape[1], generator=torch.Generator().manual_seed(seed)).to(dtype)
    nbytes = sum(ids.unique().numel() for _, ids in routes) / len(routes) * per_expert + shared
    runs = {
        "native": lambda i: qlinear.moe(x, *routes[i % ROUTINGS], *layers[i % len(layers)].native),
        "reference": lambda i: moe_reference(
            x, *routes[i % ROUTINGS], layers[i % len(layers)].experts, layers[i % len(layers)].shared_experts
        ),
    }
    calls = max(args.calls, ROUTINGS, len(layers))
    times = {name: [] for name in runs}
    for fn in runs.values():
        timed(fn, ROUTINGS)  # warm-up: every routing once
    for _ in range(args.repeats):  # interleaved
        for name, fn in runs.items():
            times[name].append(timed(fn, calls))
    row = {"batch": tokens, "layers": len(layers), "MiB read": nbytes / 2**20}
    for name, values in times.items():
        row[f"{name} ms"] = median(values) * 1e3
        row[f"{name} GB/s"] = nbytes / median(values) / 1e9
    row["native speed-up"] = row["reference ms"] / row["native ms"]
    return row


def run(args) -> dict:
    d, inter, experts, k, shared = parse_shape(args.moe)
    threads, auto = torch.get_num_threads(), resolve_dtype("auto", torch.device("cpu"))
    isa = qlinear.EXT.choose() if qlinear.available() else None
    print(
        f"{threads} threads; MoE layer D={d} I={inter} E={experts} k={k} shared={shared}; qlinear kernel: "
        + (isa or f"unavailable ({qlinear.unavailable_reason()})"),
        flush=True,
    )
    rows, llc = [], llc_bytes()
    for kind in tqdm(args.moe_weights, desc="moe", unit="weights"):
        dtype, quantization = WEIGHT_KINDS[kind]
        dtype = dtype or auto
        layers = [build_layer(d, inter, experts, k, shared, dtype, quantization)]
        count = min(MAX_LAYERS, -(-2 * llc // layer_bytes(layers[0])))  # a round reads twice the last-level cache
        layers += [build_layer(d, inter, experts, k, shared, dtype, quantization, seed=i) for i in range(1, count)]
        for tokens in args.batches:
            rows.append(
                {"weights": kind, "activations": dtype_name(dtype), **measure(layers, tokens, args, dtype, seed=tokens)}
            )
        del layers
    print_table(
        f"MoE layer experts, one call (D={d}, I={inter}, E={experts}, k={k}, shared {shared}; "
        f"median of {args.repeats} x {max(args.calls, ROUTINGS)} calls, cycling through `layers` layers: "
        f"twice the {llc / 2**20:.0f} MiB last-level cache)",
        list(rows[0].keys()),
        rows,
    )
    payload = {
        "cpu_flags": cpu.features(),
        "isa": isa,
        "threads": threads,
        "shape": args.moe,
        "llc_bytes": llc,
        "results": rows,
    }
    write_json(Path(args.out), "kernel-moe", payload)
    return payload
