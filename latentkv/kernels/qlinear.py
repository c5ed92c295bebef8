"""Native weight-only int4 / int8 linears for the CPU (csrc/qlinear/qlinear.cpp), and their packed layout.

ATen's `_weight_int4pack_mm_for_cpu` / `_weight_int8pack_mm` run 10-25x slower than a float32
F.linear on an AVX2-only EPYC (1 thread, K=576 N=1536: 4.6 / 2.6 ms against 0.33 ms), so int4
weights bought nothing there. This kernel reads the packed weight once per call, keeps the rows of
a 16-row block in the SIMD lanes (AVX2: 8, AVX-512: 16, scalar: 1, one template) and reduces each
output element over K in one fixed order, whatever M, the threads or the ISA (all paths give the
same bits): batch-invariant by construction. Few rows (M < 4; with AVX-512's 32 registers M < 12: a
MoE expert's tokens in a decode step) read codes straight from the packed weight; more (prefill) run
a GEMM-like blocked loop: rows in L2-sized blocks, K in blocks of 8 groups whose dequantized float
tile stays in L1 across the rows (float32 and bf16 weights: read as packed).

Built, its paths (qlinear_paths.h) self-checked and the capabilities that serve chosen by
kernels/build.py; `LATENTKV_QLINEAR=0` switches it off (ATen's kernels, on purpose: model/quant.py),
and a machine where it cannot be built falls back to them with one warning.

The integer-dot linears (`dot_linear`, csrc/qlinear/qlinear_dot_impl.h) quantize the activations too: int8
per row and group of the weight's (scale max|x| / 127), times int4 (w4a8: scale and min per group of 32, as
Q4_1; w4a8_g128: per group of 128) or int8 (w8a8: a scale per row, groups of 32) weights with u8 x s8
byte products: AVX-512 VNNI's vpdpbusd where the CPU has it (64 multiply-adds an instruction, into
int32), else AVX2's maddubs (32, against 8 float FMAs); the same fixed reduction order per output
element on every path (`dot_path()` says which runs). Each group's integer sum is exact, so its float
steps (a convert, a multiply, two FMAs per output and row) run once per group: per 32 inputs those steps and
AMX's C-tile stores, not the products, bound the kernel at many rows (w4a8's prefill ~2x bf16's time), per
128 a quarter as many (w4a8_g128: ~1.4x w4a8's prefill on V3-mini's shape, at the cost of coarser weights).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .build import Extension

BLOCK, GROUP, ROW_PAD = 16, 32, 64  # rows per packed block; inputs per group; packed rows: a multiple of this
ACT8 = 100  # the kernel's kind for int8 activations: 100 + weight bits (104: w4a8, 108: w8a8)
W4A8_G128, G128 = 114, 128  # the kernel's kind for w4a8 on groups of 128 inputs (sub-blocks of GROUP)


def probe_weight(kind: int, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """A random packed weight [n, k] of record `kind` (the self-check's and the tests')."""
    group = G128 if kind == W4A8_G128 else GROUP
    kp = -(-k // group) * group
    if kind in (4, ACT8 + 4, W4A8_G128):
        codes = torch.randint(0, 16, (n, kp), generator=gen)
        scale_zero = torch.stack(
            (torch.rand(kp // group, n, generator=gen) / 8, torch.randn(kp // group, n, generator=gen)), -1
        )
        return (pack_int4 if kind == 4 else pack_w4a8)(codes, scale_zero)
    if kind in (8, ACT8 + 8):
        codes, scales = (
            torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8),
            torch.rand(n, generator=gen) / 64,
        )
        return (pack_int8 if kind == 8 else pack_w8a8)(codes, scales)
    return (pack_bf16 if kind == 16 else pack_f32)(torch.randn(n, k, generator=gen))


KINDS = (4, 8, 16, 32, ACT8 + 4, ACT8 + 8, W4A8_G128)  # every record kind the kernel runs


def probe_moe(module, caps: int, gen: torch.Generator) -> list:
    """The MoE op (csrc/qlinear/moe.h) for every record kind at one and five tokens: 3 experts of width
    40 and shared experts of width 24, two slots per token."""
    e, d, inter, shared = 3, 96, 40, 24
    out = []
    for kind in KINDS:
        gate_up = torch.stack([probe_weight(kind, 2 * inter, d, gen) for _ in range(e)])
        down = torch.stack([probe_weight(kind, d, inter, gen) for _ in range(e)])
        shared_w = probe_weight(kind, 2 * shared, d, gen), probe_weight(kind, d, shared, gen)
        for rows in (1, 5):
            ids = torch.stack([torch.randperm(e, generator=gen)[:2] for _ in range(rows)])
            weights = torch.rand(rows, 2, generator=gen)
            for dtype in (torch.float32, torch.bfloat16) if kind == 16 else (torch.float32,):
                x = torch.randn(rows, d, generator=gen).to(dtype)
                y = module.moe(x, weights, ids, gate_up, down, *shared_w, kind, inter, shared, caps)
                out.append((f"moe kind {kind} {dtype} rows={rows}", y, 1e-4 if dtype == torch.float32 else 3e-2))
    return out


def probe(module, caps: int) -> list:
    """The self-check's inputs (kernels/build.py): every record kind at one, five and 16 rows (the
    decode and the blocked paths; w4a8 on AMX int8 tiles), the fused SwiGLU (AMX), and the MoE op over
    them. The FMA paths are documented bit-identical, vdpbf16ps (bf16 records times bf16 rows on
    avx512_bf16) reduces in its own order, e^x (the MoE op's SwiGLU) rounds by ISA; the check allows
    float rounding."""
    gen = torch.Generator().manual_seed(0)
    n, k = 40, 96
    packed = {kind: probe_weight(kind, n, k, gen) for kind in KINDS}
    out = []
    for rows in (1, 5, 16):
        x = torch.randn(rows, k, generator=gen)
        for kind, weights in packed.items():
            out.append((f"linear kind {kind} rows={rows}", module.linear(x, weights, kind, n, caps), 1e-4))
        out.append((f"linear bf16 rows={rows}", module.linear(x.bfloat16(), packed[8], 8, n, caps), 3e-2))
        # bf16 weights times bf16 rows: vdpbf16ps on avx512_bf16, its own order (bf16 output rounding)
        out.append((f"linear kind 16 bf16 rows={rows}", module.linear(x.bfloat16(), packed[16], 16, n, caps), 3e-2))
    amx = dict(module.paths())["amx_bf16"]
    gate_up = probe_weight(16, 64, k, gen)  # I = 32: two units of 16
    for rows in (5, 40):  # the fused SwiGLU where it runs (AMX), the product then SwiGLU on other paths
        x = torch.randn(rows, k, generator=gen).bfloat16()
        if caps & amx == amx:
            y = module.swiglu_linear(x, gate_up, 32, caps)
        else:
            gate, up = module.linear(x, gate_up, 16, 64, caps).float().chunk(2, dim=-1)
            y = (F.silu(gate).bfloat16().float() * up).bfloat16()
        out.append((f"swiglu kind 16 bf16 rows={rows}", y, 3e-2))
    return out + probe_moe(module, caps, gen)


EXT = Extension(
    "qlinear",
    "latentkv_qlinear",
    "qlinear.cpp",
    "LATENTKV_QLINEAR",
    "the native int4/int8 linears are",
    "ATen's kernels",
    probe,
)


def extension():
    """The compiled module, or None (the reason in `unavailable_reason()`); built once per process."""
    return EXT.module()


def available() -> bool:
    return EXT.available()


def unavailable_reason() -> str | None:
    return EXT.unavailable_reason()


def _pad(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """t [N, K] -> [N + rows, K + cols] with zeros appended."""
    return F.pad(t, (0, cols, 0, rows))


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 holding 32-bit patterns -> int32 with the same bits."""
    return (words - ((words >> 31) & 1) * (1 << 32)).to(torch.int32)


def pack_int4(codes: torch.Tensor, scale_zero: torch.Tensor) -> torch.Tensor:
    """quant.quantize_int4's codes [N, Kp] (0..15) and scale_zero [Kp/32, N, 2] -> packed int32
    [NB, G, 96] (NB = N rounded up to 64, over 16): per (block, group) the codes of 16 rows as 4
    words of 8 nibbles, then 16 scales and 16 minimums (zero - 8 * scale; float32 bits)."""
    n, kp = codes.shape
    g, pad = kp // GROUP, -n % ROW_PAD
    nb = (n + pad) // BLOCK
    nib = _pad(codes, pad, 0).to(torch.int64).view(nb, BLOCK, g, 4, 8)
    words = (nib << (4 * torch.arange(8))).sum(-1)  # [NB, 16, G, 4]
    words = _to_int32(words).permute(0, 2, 3, 1).reshape(nb, g, 4 * BLOCK)
    scale, zero = scale_zero.float().unbind(-1)
    sz = F.pad(torch.stack((scale, zero - 8 * scale), -1), (0, 0, 0, pad)).view(g, nb, BLOCK, 2)  # padded rows: 0
    sz = sz.permute(1, 0, 3, 2).reshape(nb, g, 2 * BLOCK).contiguous().view(torch.int32)
    return torch.cat((words, sz), dim=-1).contiguous()


def pack_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Codes q [N, K] int8 and scales [N] -> packed int32 [NB, G, 144]: per (block, group of 32
    inputs) the codes as [32 inputs][16 rows] int8, then the 16 rows' scales (float32 bits)."""
    n, k = q.shape
    pad, kpad = -n % ROW_PAD, -k % GROUP
    nb, g = (n + pad) // BLOCK, (k + kpad) // GROUP
    codes = _pad(q, pad, kpad).view(nb, BLOCK, g, GROUP).permute(0, 2, 3, 1).reshape(nb, g, GROUP * BLOCK)
    codes = codes.contiguous().view(torch.int32)  # [NB, G, 128]
    s = F.pad(scales.float(), (0, pad)).view(nb, 1, BLOCK).expand(nb, g, BLOCK).contiguous().view(torch.int32)
    return torch.cat((codes, s), dim=-1).contiguous()


def pack_f32(w: torch.Tensor) -> torch.Tensor:
    """Float32 weights w [N, K] -> packed int32 [NB, G, 528]: per (block, group of 32 inputs) the
    weights as [32 inputs][16 rows] float32, then 16 scales of 1.0 (the int8 record's layout)."""
    n, k = w.shape
    pad, kpad = -n % ROW_PAD, -k % GROUP
    nb, g = (n + pad) // BLOCK, (k + kpad) // GROUP
    rows = (
        _pad(w.detach().float(), pad, kpad).view(nb, BLOCK, g, GROUP).permute(0, 2, 3, 1).reshape(nb, g, GROUP * BLOCK)
    )
    ones = torch.ones(nb, g, BLOCK)
    return torch.cat((rows, ones), dim=-1).contiguous().view(torch.int32)


def pack_bf16(w: torch.Tensor) -> torch.Tensor:
    """bf16 weights w [N, K] -> packed int32 [NB, G, 272]: per (block, group of 32 inputs) 16 words
    for each pair of inputs (2j, 2j + 1), [16 pairs][16 rows], a word holding the row's two bf16
    (input 2j in the low half: vdpbf16ps's operand), then 16 scales of 1.0."""
    n, k = w.shape
    pad, kpad = -n % ROW_PAD, -k % GROUP
    nb, g = (n + pad) // BLOCK, (k + kpad) // GROUP
    rows = _pad(w.detach().to(torch.bfloat16), pad, kpad).view(nb, BLOCK, g, GROUP // 2, 2).permute(0, 2, 3, 1, 4)
    rows = rows.reshape(nb, g, GROUP * BLOCK).contiguous().view(torch.int32)
    ones = torch.ones(nb, g, BLOCK).view(torch.int32)
    return torch.cat((rows, ones), dim=-1).contiguous()


# w4a8: storage slot s of each 8-row half holds row W4A8_SLOTS[s], so that rows p and p + 4 share 32
# bytes and the AVX2 kernel's three hadds leave the 8 rows' sums in lane order (qlinear_dot_avx2.h W4)
W4A8_SLOTS = (0, 4, 1, 5, 2, 6, 3, 7)


def w4a8_scale_min(scale_zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quant.quantize_int4's scale_zero [G, N, 2] -> the w4a8 record's scale d_w and min m_w
    (zero - 8 * scale, the group's lowest weight) [G, N] each, float16 as stored (Q4_1's 5 bits a
    weight, not 6: float16 keeps 11 significant bits, bf16 8)."""
    scale, zero = scale_zero.float().unbind(-1)
    return scale.half(), (zero - 8 * scale).half()


def pack_w4a8(codes: torch.Tensor, scale_zero: torch.Tensor) -> torch.Tensor:
    """quant.quantize_int4's codes [N, Kp] (0..15) and scale_zero [G, N, 2] (groups of Kp / G: 32 or 128) ->
    packed int32 [NB, G, 80 or 272] for the integer-dot kernel (kind ACT8 + 4 or W4A8_G128): per (block of
    16 rows, group) the group's sub-blocks of 32 inputs, each row's 32 codes of a sub-block in 16 bytes
    (byte j: input j in the low nibble, input j + 16 in the high; rows in W4A8_SLOTS order), then 16
    scales and 16 minimums as float16 (w4a8_scale_min)."""
    n, kp = codes.shape
    g, pad = scale_zero.shape[0], -n % ROW_PAD
    subs = kp // g // GROUP
    nb = (n + pad) // BLOCK
    c = _pad(codes, pad, 0).to(torch.uint8).view(nb, BLOCK, g, subs, 2, 16)
    rows = torch.tensor(W4A8_SLOTS + tuple(8 + s for s in W4A8_SLOTS))
    nib = (c[..., 0, :] | (c[..., 1, :] << 4))[:, rows].permute(0, 2, 3, 1, 4).reshape(nb, g, subs * BLOCK * 16)
    sm = (
        F.pad(torch.stack(w4a8_scale_min(scale_zero)), (0, pad)).view(2, g, nb, BLOCK).permute(2, 1, 0, 3)
    )  # [G, N] each
    return torch.cat(
        (nib.contiguous().view(torch.int32), sm.reshape(nb, g, 2 * BLOCK).contiguous().view(torch.int32)), dim=-1
    ).contiguous()


def pack_w8a8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """quant.quantize_int8's codes q [N, K] (-127..127) and scales [N] -> packed int32 [NB, G, 144]
    for the integer-dot kernel: per (block of 16 rows, group of 32) each row's 32 codes in input order,
    then the 16 rows' scales (repeated per group), float32."""
    n, k = q.shape
    pad, kpad = -n % ROW_PAD, -k % GROUP
    nb, g = (n + pad) // BLOCK, (k + kpad) // GROUP
    codes = _pad(q, pad, kpad).view(nb, BLOCK, g, GROUP).permute(0, 2, 1, 3).reshape(nb, g, BLOCK * GROUP)
    s = F.pad(scales.float(), (0, pad)).view(nb, 1, BLOCK).expand(nb, g, BLOCK).contiguous()
    return torch.cat((codes.contiguous().view(torch.int32), s.view(torch.int32)), dim=-1).contiguous()


def dot_linear(x: torch.Tensor, packed: torch.Tensor, kind: int, out_features: int) -> torch.Tensor:
    """x [M, K] float32 / bf16, quantized to int8 per row and group inside, times a packed weight of record
    `kind` (ACT8 + 4, W4A8_G128: pack_w4a8; ACT8 + 8: pack_w8a8) -> [M, out_features] in x's dtype."""
    return extension().linear(x, packed, kind, out_features, EXT.caps.mask)


def dot_path() -> str:
    """Which path runs dot_linear under the capabilities that serve: "avx512_vnni" (vpdpbusd; AVX-512 CPUs
    with avx512_vnni, csrc/qlinear/qlinear_dot_vnni.h), "avx2" (maddubs) or "scalar"."""
    return extension().dot_path(EXT.caps.mask)


def quantize_activations(x: torch.Tensor, groups: int, kind: int = ACT8 + 8) -> tuple[torch.Tensor, ...]:
    """x [M, K] -> what dot_linear of record `kind` multiplies: int8 codes [M, group * groups], d_x and s_x
    [M, groups] float32, the codes' sums [M, groups] int32."""
    return tuple(extension().quantize_activations(x, groups, kind, EXT.caps.mask))


def moe(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    shared_gate_up: torch.Tensor | None,
    shared_down: torch.Tensor | None,
    kind: int,
    inter: int,
    shared_inter: int = 0,
) -> torch.Tensor:
    """A MoE layer's experts in one call (csrc/qlinear/moe.h). x [T, D] float32 / bf16; weights [T, k]
    float32 and ids [T, k] int64 (the router's); gate_up [E, NB, G, REC] and down [E, NB', G', REC]: the
    routed experts' packed gate_up (2 * inter outputs, gate then up) and down (D outputs), stacked;
    shared_gate_up / shared_down: the shared experts' (None: none), shared_inter their width; records
    of `kind` (KINDS) -> [T, D] in x's dtype: per token, the sum over its
    slots in order of weights[t, s] times expert ids[t, s]'s MLP (its modules' bits), then the shared
    experts' output, in float32 (model/deepseek.py moe_reference: the same steps)."""
    none = gate_up.new_empty(0)
    return extension().moe(
        x,
        weights,
        ids,
        gate_up,
        down,
        none if shared_gate_up is None else shared_gate_up,
        none if shared_down is None else shared_down,
        kind,
        inter,
        shared_inter,
        EXT.caps.mask,
    )


def linear(x: torch.Tensor, packed: torch.Tensor, bits: int, out_features: int) -> torch.Tensor:
    """x [M, K] float32 / bf16 times a packed weight (bits 4, 8, 16: bf16, or 32: float32) -> [M, out_features]
    in x's dtype."""
    return extension().linear(x, packed, bits, out_features, EXT.caps.mask)


def runs_amx() -> bool:
    """The kernel runs bf16 products on AMX tiles here (built, and the amx_bf16 path serves)."""
    return EXT.serves("amx_bf16")


def moe_route(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    softmax: bool,
    n_group: int,
    topk_group: int,
    noaux: bool,
    group_limited: bool,
    k: int,
    normalized: bool,
    scale: float,
):
    """A MoE layer's router after its logits (csrc/qlinear/moe_route.h), every token in one native pass:
    logits [T, E] float32, bias [E] or None -> (weights [T, k] float32, ids [T, k] int64): scores by
    softmax (V2) or sigmoid (V3), + bias, the best topk_group groups kept, the top k (ties: the lower
    expert first), their scores normalized where asked, times scale."""
    return extension().moe_route(
        logits,
        logits.new_empty(0) if bias is None else bias.contiguous(),
        softmax,
        n_group,
        topk_group,
        noaux,
        group_limited,
        k,
        normalized,
        scale,
    )


def fused_swiglu(packed_bits: int, inter: int) -> bool:
    """Whether swiglu_linear runs here for a [gate; up] weight of `packed_bits` (16: bf16) and I = inter:
    bf16 on AMX (amx_bf16), I a multiple of 16."""
    return runs_amx() and packed_bits == 16 and inter % 16 == 0


def swiglu_linear(x: torch.Tensor, packed: torch.Tensor, inter: int) -> torch.Tensor:
    """bf16 x [M, K] times a packed bf16 [gate; up] weight of 2 * inter rows -> silu(gate) * up [M, inter]
    (the bits of linear then silu_mul; where fused_swiglu says it runs)."""
    return extension().swiglu_linear(x, packed, inter, EXT.caps.mask)
