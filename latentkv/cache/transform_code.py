"""The transform-coded cache format: every latent and rope-key direction with its own bits (0-8).

A converted layer caches c [T, r] (its latent, in the PCA basis: direction i carries the i-th
largest share of the attention-output energy) and k_r [T, dr] (the rope key, after RoPE). The
format gives each of those r + dr directions a number of bits, chosen by bit_alloc.py. Per side
(latent, rope key) and per bit value b > 0, the directions with b bits, in index order, are cut
into groups of at most `group`; a group of n values is turned by the fixed orthogonal map of
cache/q4.py (`q4.turn`: Walsh-Hadamard passes with sign flips, so no one outlier sets the scale)
and stored as b-bit codes with one float16 scale per token: the group's RMS. A value y is coded
u = clamp(floor(y / Δ) + 2^(b-1), 0, 2^b - 1), read back as (u - 2^(b-1) + ½) Δ, with
Δ = STEP[b] · RMS: the step of the minimum-error uniform quantizer of a unit Gaussian (Max, 1960),
whose error per unit variance is DISTORTION[b]. Directions with 0 bits are not stored (read as 0).

Centred (`TransformCode.latent_mean` / `rope_mean`, from calibration): what is coded is each row
less a fixed per-direction mean — the latent's, and the rope key's before RoPE turned by the
token's position (the rope key of the bundled model is 63-76% mean by energy, a per-channel offset
that a per-token scale would otherwise spend its range on); a reader adds it back. The means are
format constants (in the record), not bytes per token.

Bytes a token takes in one layer: ceil(code bits / 8) + SCALE_BYTES per group (`layer_bytes`).
The record (`TransformCode.to_dict`) is what config.json holds under latentkv.cache_format and
`from_dict` reads it back exactly. A folder that records one is served in it (cache/coded.py: a layer's
tokens in the paged cache, written quantized by `encode`, read by the native decode kernel through
coded.kernel_view and dequantized by `decode` for the other readers); convert/simulated.py measures it by
`round_trip` in the reference model.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from latentkv import invariant
from latentkv.cache import q4
from latentkv.facts import TRANSFORM_CODE

KIND = TRANSFORM_CODE
MAX_BITS = 8
GROUP = 64  # values per scale at most: 0.25 bit a value for the float16 scale
SCALE_BYTES = 2  # float16 RMS per group and token
# optimum uniform quantizer of a unit Gaussian with 2^b levels: step and mean squared error (Max 1960, table I)
STEP = (0.0, 1.596, 0.9957, 0.5860, 0.3352, 0.1881, 0.1041, 0.05687, 0.03076)
DISTORTION = (1.0, 0.3634, 0.1188, 0.03744, 0.01154, 0.003490, 0.001035, 0.0003035, 0.00008778)


def groups(bits: list[int], group: int = GROUP) -> list[tuple[int, list[int]]]:
    """(b, direction indices) of each stored group of one side: for each b > 0 (ascending), the
    directions with b bits in index order, cut into runs of at most `group`."""
    out = []
    for b in sorted({b for b in bits if b > 0}):
        idx = [i for i, bi in enumerate(bits) if bi == b]
        out += [(b, idx[s : s + group]) for s in range(0, len(idx), group)]
    return out


def side_cost(bits: list[int], group: int = GROUP) -> tuple[int, int]:
    """(code bits, scale groups) of one side's directions."""
    counts: dict[int, int] = {}
    for b in bits:
        if b:
            counts[b] = counts.get(b, 0) + 1
    return sum(b * n for b, n in counts.items()), sum(-(-n // group) for n in counts.values())


def layer_bytes(
    latent_bits: list[int], rope_bits: list[int], group: int = GROUP, scale_bytes: int = SCALE_BYTES
) -> int:
    """Bytes one token takes in one layer: its codes packed together, then a scale per group."""
    (lb, lg), (rb, rg) = side_cost(latent_bits, group), side_cost(rope_bits, group)
    return -(-(lb + rb) // 8) + scale_bytes * (lg + rg)


@dataclass(frozen=True)
class TransformCode:
    """Bits per direction, per layer: latent_bits[layer] [r], rope_bits[layer] [dr]; group: values per
    scale; latent_mean[layer] [r] and rope_mean[layer] [dr] (before RoPE): what is coded is the row
    less its mean (None: not centred)."""

    latent_bits: tuple[tuple[int, ...], ...]
    rope_bits: tuple[tuple[int, ...], ...]
    group: int = GROUP
    latent_mean: tuple[tuple[float, ...], ...] | None = None
    rope_mean: tuple[tuple[float, ...], ...] | None = None

    def centred(self, latent_mean, rope_mean) -> "TransformCode":
        """The same bits, coding each row less these means (per layer: [r], [dr] before RoPE)."""

        def rows(means):
            return tuple(tuple(float(v) for v in m) for m in means)

        return TransformCode(self.latent_bits, self.rope_bits, self.group, rows(latent_mean), rows(rope_mean))

    def layer_bytes(self, layer: int) -> int:
        return layer_bytes(list(self.latent_bits[layer]), list(self.rope_bits[layer]), self.group)

    def bytes_per_token(self) -> int:
        return sum(self.layer_bytes(i) for i in range(len(self.latent_bits)))

    def ranks(self) -> list[int]:
        """Latent directions stored (bits > 0) per layer: the effective rank."""
        return [sum(1 for b in bits if b) for bits in self.latent_bits]

    def describe(self) -> str:
        """One line: bytes, mean bits per stored direction and the effective ranks / rope dims."""
        lat = [b for bits in self.latent_bits for b in bits if b]
        rope = [b for bits in self.rope_bits for b in bits if b]
        ranks = self.ranks()
        ropes = [sum(1 for b in bits if b) for bits in self.rope_bits]
        kind = "transform code" + (" (centred)" if self.latent_mean is not None else "")
        return (
            f"{kind}: {self.bytes_per_token()} B/token; latent {min(ranks)}-{max(ranks)} directions "
            f"at {sum(lat) / max(1, len(lat)):.2f} bits, rope key {min(ropes)}-{max(ropes)} dims at "
            f"{sum(rope) / max(1, len(rope)):.2f} bits"
        )

    def to_dict(self) -> dict:
        """The config.json record (latentkv.cache_format)."""
        record = {
            "kind": KIND,
            "group": self.group,
            "scale": "float16 rms",
            "steps": list(STEP),
            "latent_bits": [list(b) for b in self.latent_bits],
            "rope_bits": [list(b) for b in self.rope_bits],
        }
        if self.latent_mean is not None:
            record.update(latent_mean=[list(m) for m in self.latent_mean], rope_mean=[list(m) for m in self.rope_mean])
        return record

    @classmethod
    def from_dict(cls, record: dict, layers: int | None = None) -> "TransformCode":
        """Read a record back, checked: a bad one raises ValueError naming what is wrong."""
        if not isinstance(record, dict) or record.get("kind") != KIND:
            raise ValueError(f"latentkv.cache_format: expected a record of kind {KIND!r}, got {record!r:.80}")
        if record.get("steps", list(STEP)) != list(STEP):
            raise ValueError("latentkv.cache_format: its quantizer steps are not this version's")
        group = record.get("group", GROUP)
        if not isinstance(group, int) or group < 1:
            raise ValueError(f"latentkv.cache_format.group must be a positive int, got {group!r}")
        sides = []
        for name in ("latent_bits", "rope_bits"):
            value = record.get(name)
            if not isinstance(value, list) or (layers is not None and len(value) != layers):
                raise ValueError(f"latentkv.cache_format.{name} must be a list of {layers or 'per-layer'} lists")
            for row in value:
                if not isinstance(row, list) or any(not isinstance(b, int) or not 0 <= b <= MAX_BITS for b in row):
                    raise ValueError(f"latentkv.cache_format.{name}: every entry is an int in 0..{MAX_BITS}")
            sides.append(tuple(tuple(row) for row in value))
        if len(sides[0]) != len(sides[1]):
            raise ValueError("latentkv.cache_format: latent_bits and rope_bits differ in layers")
        means = []
        for name, bits in (("latent_mean", sides[0]), ("rope_mean", sides[1])):
            value = record.get(name)
            if value is not None and (
                not isinstance(value, list)
                or [len(m) if isinstance(m, list) else -1 for m in value] != [len(b) for b in bits]
                or any(not isinstance(v, (int, float)) or not math.isfinite(v) for m in value for v in m)
            ):
                raise ValueError(f"latentkv.cache_format.{name}: a list of finite numbers per direction, per layer")
            means.append(None if value is None else tuple(tuple(float(v) for v in m) for m in value))
        if (means[0] is None) != (means[1] is None):
            raise ValueError("latentkv.cache_format: latent_mean and rope_mean come together")
        return cls(sides[0], sides[1], group, *means)


@dataclass(frozen=True)
class SideMaps:
    """One side's groups as whole-row maps: turn [stored values, n] (R per group in its rows and columns: y =
    x @ turnᵀ, x = y @ turn) and back (turnᵀ, contiguous), group [stored values] (each value's group), step
    and half [stored values] (STEP[b] and 2^(b-1) of each value's bits), sizes [groups] (values per group)."""

    turn: torch.Tensor
    back: torch.Tensor
    group: torch.Tensor
    step: torch.Tensor
    half: torch.Tensor
    sizes: torch.Tensor


# kept across calls: first made under the engine's inference mode, still usable with autograd
@functools.cache
@torch.inference_mode(False)
def side_maps(bits: tuple[int, ...], group: int) -> SideMaps:
    parts = groups(list(bits), group)
    stored = sum(len(idx) for _, idx in parts)
    turn = torch.zeros(stored, len(bits))
    at, owner, step, half = 0, [], [], []
    for g, (b, idx) in enumerate(parts):
        turn[at : at + len(idx), idx] = q4.turn(torch.eye(len(idx))).T  # rows: R e_i's transposes, i.e. R
        owner += [g] * len(idx)
        step += [STEP[b]] * len(idx)
        half += [float(1 << (b - 1))] * len(idx)
        at += len(idx)
    sizes = torch.tensor([float(len(idx)) for _, idx in parts])
    owner = torch.tensor(owner, dtype=torch.long)
    return SideMaps(turn, turn.T.contiguous(), owner, torch.tensor(step), torch.tensor(half), sizes)


def encode(x: torch.Tensor, bits: list[int], group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, n] -> (codes uint8 [T, stored values] in the order of `groups(bits)`, scales float16 [T,
    groups]): every group turned by one fixed-order product (rows independent of T), its RMS the scale."""
    maps = side_maps(tuple(bits), group)
    y = invariant.linear(x.float(), maps.turn.to(x.device))
    ms = torch.zeros(x.shape[0], len(maps.sizes), device=x.device).index_add_(1, maps.group.to(x.device), y.square())
    scale = (ms / maps.sizes.to(x.device)).sqrt().half()
    tiny = torch.finfo(torch.float16).tiny
    step = scale.float().clamp(min=tiny).index_select(1, maps.group.to(x.device)) * maps.step.to(x.device)
    half = maps.half.to(x.device)
    codes = (torch.floor(y / step) + half).clamp_(min=0).minimum(2 * half - 1).to(torch.uint8)
    return codes, scale


def decode(codes: torch.Tensor, scale: torch.Tensor, bits: list[int], group: int = GROUP) -> torch.Tensor:
    """encode's output -> x [T, n] float32 (0 where a direction has no bits)."""
    maps = side_maps(tuple(bits), group)
    device = codes.device
    y = (codes.float() - maps.half.to(device) + 0.5) * (
        scale.float().index_select(1, maps.group.to(device)) * maps.step.to(device)
    )
    return invariant.linear(y, maps.back.to(device))


def round_trip(x: torch.Tensor, bits: list[int], group: int = GROUP, mean: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., n] stored in the format and read back, in x's dtype (the cache a reader would see);
    mean [..., n] (broadcast): coded less it, added back on reading."""
    if len(bits) != x.shape[-1]:
        raise ValueError(f"{len(bits)} directions' bits for rows of {x.shape[-1]}")
    if mean is not None:
        mean = mean.to(x.dtype).expand_as(x)
        return round_trip(x - mean, bits, group) + mean
    rows = x.reshape(-1, x.shape[-1])
    if not any(bits):
        return torch.zeros_like(x)
    return decode(*encode(rows, bits, group), bits, group).to(x.dtype).view(x.shape)


def expected_error(variances: torch.Tensor, bits: list[int]) -> float:
    """The model of the error the allocation minimizes: Σ_i variance_i · DISTORTION[bits_i]."""
    return float(sum(float(v) * DISTORTION[b] for v, b in zip(variances, bits)))


def fits(code: TransformCode, kv_bytes: int) -> bool:
    return code.bytes_per_token() <= kv_bytes


def folder_code(cfg) -> TransformCode | None:
    """The transform code a folder's config (a ModelConfig) records (latentkv.cache_format), or None."""
    record = cfg.extensions.get("cache_format")
    return None if record is None else TransformCode.from_dict(record, cfg.num_hidden_layers)


assert all(a > b for a, b in zip(DISTORTION, DISTORTION[1:])) and math.isclose(DISTORTION[0], 1.0)
