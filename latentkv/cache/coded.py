"""One layer of a transform-coded latent cache (cache/transform_code.py's format) as the paged cache holds
it: per token, the codes of every stored group of both sides packed into one run of bytes, then the
groups' float16 scales.

A layer's token is `codes` uint8 [ceil(code bits / 8)] — the groups of `transform_code.groups` of the
latent, then of the rope key, each group's b-bit codes value after value, packed least significant bit
first, with no padding between values or groups — and `scale` float16 [latent groups + rope groups] in the
same order: `TransformCode.layer_bytes` in all. Centred: what is coded is the latent less its mean and the
rope key less its mean turned by the token's position (RoPE at this layer's frequencies and factor, the
model's own `rope.py`), so a reader that adds them back needs the rows' positions.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from latentkv import invariant
from latentkv.cache import transform_code as tc
from latentkv.config import ModelConfig
from latentkv.kernels import decode_ops, qlinear
from latentkv.kernels.attention import coded_runs
from latentkv.rope import apply_rope, attention_factor, cos_sin, layer_inv_freq


@dataclass(frozen=True)
class LayerCode:
    """What one layer's cache needs of a transform code: the bits of its r latent and dr rope-key
    directions, the group, the means (None: not centred; the rope key's before RoPE) and the layer's RoPE
    (frequencies [dr/2], YaRN's factor on cos / sin, the pair layout) to turn the rope key's mean."""

    latent_bits: tuple[int, ...]
    rope_bits: tuple[int, ...]
    group: int
    latent_mean: tuple[float, ...] | None
    rope_mean: tuple[float, ...] | None
    inv_freq: tuple[float, ...]
    rope_factor: float = 1.0
    interleaved: bool = True

    @functools.cached_property  # (a frozen dataclass's fields never change: worked out once, not per write)
    def widths(self) -> list[int]:
        """Bits of every stored value, in the packed order (latent groups, then rope groups)."""
        return [
            b
            for side in (self.latent_bits, self.rope_bits)
            for b, idx in tc.groups(list(side), self.group)
            for _ in idx
        ]

    @property
    def code_bytes(self) -> int:
        return -(-sum(self.widths) // 8)

    @property
    def scales(self) -> int:
        """float16 scales a token takes: one per group of either side."""
        return len(tc.groups(list(self.latent_bits), self.group)) + len(tc.groups(list(self.rope_bits), self.group))

    @property
    def nbytes(self) -> int:
        """Bytes a token takes: TransformCode.layer_bytes of this layer."""
        return self.code_bytes + tc.SCALE_BYTES * self.scales

    def turned_mean(self, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The rope key's mean turned by each token's angles cos, sin [T, dr/2] -> [T, dr] float32, as
        convert/simulated.py turns it."""
        mean = torch.tensor(self.rope_mean, dtype=torch.float32, device=cos.device)
        return apply_rope(mean.expand(cos.shape[0], 1, -1), cos, sin, self.interleaved)[:, 0]

    def angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N] -> cos, sin [N, dr/2] as the model's rope_tables gives them."""
        cos, sin = cos_sin(positions, torch.tensor(self.inv_freq, dtype=torch.float32, device=positions.device))
        return (cos, sin) if self.rope_factor == 1.0 else (cos * self.rope_factor, sin * self.rope_factor)


@functools.cache
def _layout(widths: tuple[int, ...], device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(byte index, shift in it, mask) of each packed value: a value of b <= 8 bits spans two bytes at most."""
    offsets = torch.tensor([0, *widths[:-1]], dtype=torch.int64).cumsum(0)
    masks = (1 << torch.tensor(widths, dtype=torch.int32)) - 1
    return (offsets // 8).to(device), (offsets % 8).to(torch.int32).to(device), masks.to(device)


def pack(values: torch.Tensor, widths: list[int]) -> torch.Tensor:
    """values [T, n] (codes, value j below 2^widths[j]) -> uint8 [T, ceil(sum(widths) / 8)]."""
    nbytes = -(-sum(widths) // 8)
    index, shift, _ = _layout(tuple(widths), str(values.device))
    shifted = values.to(torch.int32) << shift  # up to 15 bits: the low byte, then the next
    out = torch.zeros(values.shape[0], nbytes + 1, dtype=torch.int32, device=values.device)
    out.index_add_(1, index, shifted & 0xFF)  # the values' bits do not overlap: a sum is an or
    out.index_add_(1, index + 1, shifted >> 8)
    return out[:, :nbytes].to(torch.uint8)


def unpack(packed: torch.Tensor, widths: list[int]) -> torch.Tensor:
    """pack's output [N, nbytes] -> the values [N, n] int32."""
    index, shift, masks = _layout(tuple(widths), str(packed.device))
    wide = torch.nn.functional.pad(packed.to(torch.int32), (0, 1))
    pair = wide.index_select(1, index) | (wide.index_select(1, index + 1) << 8)
    return (pair >> shift) & masks


def encode(code: LayerCode, c: torch.Tensor, k_r: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """c [T, r], k_r [T, dr] (after RoPE) at angles cos, sin [T, dr/2] -> (codes uint8 [T, code_bytes],
    scales float16 [T, scales]): each side less its mean (the rope key's turned), in the model's dtype as
    transform_code.round_trip subtracts it."""
    if code.latent_mean is not None:
        c = c - torch.tensor(code.latent_mean, device=c.device).to(c.dtype)
        k_r = k_r - code.turned_mean(cos, sin).to(k_r.dtype)
    latent, latent_scale = tc.encode(c, list(code.latent_bits), code.group)
    rope, rope_scale = tc.encode(k_r, list(code.rope_bits), code.group)
    return pack(torch.cat((latent, rope), dim=1), code.widths), torch.cat((latent_scale, rope_scale), dim=1)


def decode(
    code: LayerCode, packed: torch.Tensor, scales: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """packed [N, code_bytes], scales [N, scales] of tokens at positions [N] -> [c ; k_r] rows [N, r + dr]
    in `dtype`, the means added back as transform_code.round_trip adds them (in `dtype`): one native call
    where the fused ops run (decode_ops coded_read: reference_decode's bits), else reference_decode."""
    if decode_ops.available() and packed.device.type == "cpu" and dtype in (torch.float32, torch.bfloat16):
        module = decode_ops.extension()
        out = torch.empty(packed.shape[0], len(code.latent_bits) + len(code.rope_bits), dtype=dtype)
        none = torch.empty(0)
        cos, sin = (none, none) if code.latent_mean is None else code.angles(positions)
        module.coded_read(
            packed.contiguous(), scales.contiguous(), cos.contiguous(), sin.contiguous(), out, native_code(code, module)
        )
        return out
    return reference_decode(code, packed, scales, positions, dtype)


def reference_decode(
    code: LayerCode, packed: torch.Tensor, scales: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """decode in torch ops (the format's definition)."""
    r = len(code.latent_bits)
    values = unpack(packed, code.widths).to(torch.uint8) if code.widths else packed[:, :0]
    latent = tc.side_maps(code.latent_bits, code.group)
    latent_values, latent_groups = latent.turn.shape[0], len(latent.sizes)
    out = torch.cat(
        (
            tc.decode(values[:, :latent_values], scales[:, :latent_groups], list(code.latent_bits), code.group),
            tc.decode(values[:, latent_values:], scales[:, latent_groups:], list(code.rope_bits), code.group),
        ),
        dim=1,
    ).to(dtype)
    if code.latent_mean is not None:
        out[:, :r] += torch.tensor(code.latent_mean, device=packed.device).to(dtype)
        out[:, r:] += code.turned_mean(*code.angles(positions)).to(dtype)
    return out


@dataclass
class KernelView:
    """A layer's code as the native decode kernel reads it (kernels/attention.py mla_decode_coded). A token
    widens to a row of the stored latent values, zeros to a multiple of 32 (the bf16 loops' steps), the
    rope key's values, zeros to a multiple of 32 with what follows, then cos and sin of its position at
    each distinct RoPE frequency (`cs`). `query_map` [row, r + dr] turns an absorbed query into that row's
    basis (a group's values are R x, so q . x = (R q) . y) and weighs cos and sin by the rope key's turned
    mean (linear in them); `out_map` [r, latent columns] turns the kernel's output back (Rᵀ per group, 0
    for a direction with no bits), to which the latent's mean is added (the weights sum to 1; in the
    scores it is one constant per row, which the softmax drops). Served decode rows never take these two
    maps: a layer folds `latent_map` and `out_map` into its absorbed weights (attention/layer_api.py
    LatentTurn) and maps only the rope query, `rope_map` (latentkv's fixed-order float32 kernel where it
    is built: rope_packed; the decode plan runs the same), so turn_query and turn_back (the unfolded form,
    attention/native_backend.py coded_latent_attention) stay invariant.linear's."""

    runs: torch.Tensor
    steps: torch.Tensor
    query_map: torch.Tensor
    out_map: torch.Tensor
    latent_mean: torch.Tensor | None
    latent_columns: int  # the kernel's output width: the latent values and their padding
    freqs: torch.Tensor  # [f] the distinct RoPE frequencies
    factor: float
    latent_map: torch.Tensor  # [latent columns, r]: query_map's latent block (a layer folds it: LatentTurn)
    rope_map: torch.Tensor  # [row width - latent columns, dr]: its rope block (the rope key's and cos / sin columns)
    rope_packed: torch.Tensor | None
    _cs: torch.Tensor | None = None

    def turn_rope(self, q_rope: torch.Tensor) -> torch.Tensor:
        """The rope query [..., dr] -> its row columns [..., E] in its dtype (rope_map, float32; LatentTurn)."""
        flat = q_rope.reshape(-1, q_rope.shape[-1]).float()
        if self.rope_packed is None:
            flat = invariant.linear(flat, self.rope_map)
        else:
            flat = qlinear.linear(flat, self.rope_packed, 32, self.rope_map.shape[0])
        return flat.to(q_rope.dtype).view(*q_rope.shape[:-1], -1)

    def turn_query(self, query: torch.Tensor) -> torch.Tensor:
        """query [N, r + dr] -> [N, row width] float32 (query_map)."""
        return invariant.linear(query.float(), self.query_map)

    def turn_back(self, out: torch.Tensor) -> torch.Tensor:
        """The kernel's output [N, latent columns] -> [N, r] float32 (out_map), the latent's mean added."""
        o_lat = invariant.linear(out.float(), self.out_map)
        if self.latent_mean is not None:
            o_lat += self.latent_mean
        return o_lat

    def cs(self, positions: int) -> torch.Tensor:
        """[>= positions, 2f] float32: cos then sin (times the RoPE factor) of positions 0, 1, ... at the
        distinct frequencies (grown by doubling, kept)."""
        if self._cs is None or self._cs.shape[0] < positions:
            n = max(1024, 1 << (positions - 1).bit_length())
            cos, sin = cos_sin(torch.arange(n), self.freqs)
            self._cs = (torch.cat((cos, sin), dim=-1) * self.factor).contiguous()
        return self._cs


def _pad32(n: int) -> int:
    return -(-n // 32) * 32


@functools.cache
@torch.inference_mode(False)  # (kept across calls, as transform_code.side_maps)
def kernel_view(code: LayerCode) -> KernelView:
    r, dr = len(code.latent_bits), len(code.rope_bits)
    latent, rope = tc.side_maps(code.latent_bits, code.group), tc.side_maps(code.rope_bits, code.group)
    latent_columns = _pad32(latent.turn.shape[0])
    freqs, slot = torch.tensor(code.inv_freq).unique(return_inverse=True)
    cs_at = _pad32(latent_columns + rope.turn.shape[0] + 2 * len(freqs)) - 2 * len(freqs)
    qmap = torch.zeros(r + dr, cs_at + 2 * len(freqs))
    parts = []
    for bits, maps, rows, col in (
        (code.latent_bits, latent, slice(0, r), 0),
        (code.rope_bits, rope, slice(r, None), latent_columns),
    ):
        qmap[rows, col : col + maps.turn.shape[0]] = maps.back  # q . turnᵀ y: the query turned as the codes were
        for b, idx in tc.groups(list(bits), code.group):
            parts.append((b, len(idx), tc.STEP[b], col))
            col += len(idx)
    if code.rope_mean is not None:  # q_r . turned mean = (cos ; sin) . (A q_r): A's rows the mean at unit angles
        half = dr // 2
        unit = torch.eye(dr)
        weights = code.turned_mean(unit[:, :half], unit[:, half:]).T  # [dr, dr]: columns cos_k, then sin_k
        f = len(freqs)
        qmap[r:, cs_at : cs_at + f].index_add_(1, slot, weights[:, :half])  # one column per distinct frequency
        qmap[r:, cs_at + f :].index_add_(1, slot, weights[:, half:])
    runs, steps = coded_runs(parts)
    mean = None if code.latent_mean is None else torch.tensor(code.latent_mean, dtype=torch.float32)
    query_map, out_map = qmap.T.contiguous(), qmap[:r, :latent_columns].contiguous()
    rope_map = qmap[r:, latent_columns:].T.contiguous()  # (the latent's rows map to its columns only, and back)
    return KernelView(
        runs,
        steps,
        query_map,
        out_map,
        mean,
        latent_columns,
        freqs,
        code.rope_factor,
        qmap[:r, :latent_columns].T.contiguous(),
        rope_map,
        qlinear.pack_f32(rope_map) if qlinear.available() else None,
    )


@functools.cache
@torch.inference_mode(False)  # (kept across calls, as kernel_view)
def native_code(code: LayerCode, module):
    """The layer's code as the native writer and the decode plan take it: `module` (kernels/decode_ops.py's
    extension) PlanCoded (csrc/decode_ops/plan_layer.h): encode's side maps and means, the packed widths,
    and kernel_view's reader tables and rope map."""
    view = kernel_view(code)

    def side(bits: tuple[int, ...]):
        m = tc.side_maps(bits, code.group)
        return module.PlanCodedSide(
            turn=m.turn, back=m.back, group=m.group, sizes=m.sizes, step=m.step, half=m.half, top=2 * m.half - 1
        )

    return module.PlanCoded(
        latent_side=side(code.latent_bits),
        rope_side=side(code.rope_bits),
        latent_mean=view.latent_mean,
        rope_mean=None if code.rope_mean is None else torch.tensor(code.rope_mean, dtype=torch.float32),
        interleaved=code.interleaved,
        widths=torch.tensor(code.widths, dtype=torch.uint8),
        runs=view.runs,
        steps=view.steps,
        rope_map=view.rope_map,
        rope_packed=view.rope_packed,
        latent_columns=view.latent_columns,
    )


def layer_codes(cfg: ModelConfig) -> list[LayerCode]:
    """The folder's transform code (latentkv.cache_format) per layer, with each layer's RoPE; a folder
    without one is an error naming what it records instead."""
    code = tc.folder_code(cfg)
    if code is None:
        raise ValueError(
            f"a {tc.KIND} cache needs a folder that records one (latentkv.cache_format, convert --kv-bytes); "
            f"this one records {cfg.cache_dtype or 'no cache format'}"
        )
    out = []
    for i in range(cfg.num_hidden_layers):
        if len(code.latent_bits[i]) != cfg.kv_rank(i) or len(code.rope_bits[i]) != cfg.qk_rope_head_dim:
            raise ValueError(
                f"latentkv.cache_format: layer {i} codes {len(code.latent_bits[i])} + {len(code.rope_bits[i])} "
                f"directions, the model caches {cfg.kv_rank(i)} + {cfg.qk_rope_head_dim}"
            )
        out.append(
            LayerCode(
                code.latent_bits[i],
                code.rope_bits[i],
                code.group,
                None if code.latent_mean is None else code.latent_mean[i],
                None if code.rope_mean is None else code.rope_mean[i],
                tuple(layer_inv_freq(cfg, i).tolist()),
                attention_factor(cfg.rope_scaling),
                cfg.rope_interleave,
            )
        )
    return out
