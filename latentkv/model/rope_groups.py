"""Grouped rope keys: a converted GQA model's shared rope key, un-mixed per source KV head for prefill.

An exact conversion of a model with G KV heads keeps, at each RoPE frequency, one rope pair per
source KV head, mixed by their principal components and balanced (convert/rope_plan.py,
rope_scale.py): the shared rope key is G pairs wide per frequency, and every query head reads all
of it. Yet a query head's rows at one frequency are one pair of rows p_h times a vector c_h over
the frequency's slots (rank 1), and c_h points the same way for every head of one source group.
So with ĉ_g that direction (unit length), head h's score terms at frequency f are
    Σ_j q_{h,j} · k_j = (Σ_j ĉ_{g,j} q_{h,j}) · (Σ_j ĉ_{g,j} k_j),
one pair of query against one pair of key per group: prefill attends with 2F values of rope key a
head (F frequencies) instead of the shared G·2F (SmolLM2's 3 KV heads: 64 instead of 192, the
original model's width). The pairs of one frequency turn by one angle, so the un-mixing commutes
with RoPE and applies to rotated rows. The cache keeps the mixed key (decode reads it as it is).

`find` checks the structure on the loaded query weights (rank 1 within the weight dtype's rounding,
one direction per group, groups of consecutive heads as GQA numbers them) and returns None where it
does not hold: DeepSeek's own checkpoints (one slot a frequency), refined or other conversions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..kernels import qlinear
from . import fused
from .quant import FixedOrderLinear


@dataclass
class RopeGroups:
    """basis [G, dr, 2F]: group g's un-mixed rope key is k_r · basis[g] (pair f at 2f, 2f + 1);
    heads_per_group consecutive query heads read each; slots [F]: a rope slot (column of the
    layer's cos / sin [T, dr/2]) at pair f's frequency."""

    basis: torch.Tensor
    heads_per_group: int
    slots: torch.Tensor
    _weights: dict = field(default_factory=dict, repr=False, compare=False)  # dtype -> _Weights

    @property
    def groups(self) -> int:
        return self.basis.shape[0]

    # Both row-invariant (a row's bits do not depend on the rows beside it: the prefill's batch
    # invariance), with their weights packed once per dtype: the queries through the native
    # per-head matmul, the keys through latentkv's fixed-order linear where it is built.
    def queries(self, q_rope: torch.Tensor) -> torch.Tensor:
        """q_rope [n, H, dr] (rotated) -> [n, H, 2F]: each head's pairs in its group's basis."""
        w = self._for(q_rope.dtype)
        return fused.head_matmul(q_rope.contiguous(), w.heads, kernel=True, packed=w.heads_packed)

    def mix(self, q: torch.Tensor) -> torch.Tensor:
        """Un-mixed queries q [n, H, 2F] (rotated) -> [n, H, dr]: each head's pairs back over the shared key."""
        weight, packed = self.mix_weights(q.dtype)
        return fused.head_matmul(q.contiguous(), weight, kernel=True, packed=packed)

    def mix_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """mix's per-head weight [H, 2F, dr] for queries in `dtype`, and its head_pack."""
        w = self._for(dtype)
        return w.mix, w.mix_packed

    def fold(
        self, weight: torch.Tensor, bias: torch.Tensor | None, nope: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A query projection's weight [H * (nope + dr) + rest, K] (bias [same]) -> the one whose
        head rows are [nope rows ; basisᵀ · rope rows] ([H * (nope + 2F) + rest, K]): its rope part
        is queries() of the original's, before RoPE (they commute), rounded once to the weight's dtype."""
        heads = self.basis.shape[0] * self.heads_per_group
        dr = self.basis.shape[1]
        b = self.basis.double().repeat_interleave(self.heads_per_group, 0).transpose(1, 2)  # [H, 2F, dr]

        def fold_rows(rows: torch.Tensor) -> torch.Tensor:
            q = rows[: heads * (nope + dr)].double().view(heads, nope + dr, *rows.shape[1:])
            rope = torch.einsum("hfd,hd...->hf...", b, q[:, nope:])
            return torch.cat(
                (torch.cat((q[:, :nope], rope), dim=1).flatten(0, 1).to(rows.dtype), rows[heads * (nope + dr) :])
            )

        return fold_rows(weight), None if bias is None else fold_rows(bias)

    def keys(self, k_r: torch.Tensor) -> torch.Tensor:
        """k_r [S, dr] (rotated) -> [S, G, 2F] contiguous: every group's un-mixed rope key."""
        w = self._for(k_r.dtype)
        if w.keys is not None:
            out = w.keys(k_r.contiguous())
        else:
            out = fused.head_matmul(
                k_r[:, None].expand(-1, self.groups, -1).contiguous(), self.basis.to(w.heads.dtype), kernel=True
            )
        return out.view(k_r.shape[0], self.groups, -1)

    def _for(self, dtype: torch.dtype) -> "_Weights":
        if dtype not in self._weights:
            dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
            heads = self.basis.repeat_interleave(self.heads_per_group, 0).to(dtype).contiguous()  # [H, dr, 2F]
            keys = None
            if qlinear.available():  # the groups' bases as one linear's weight [G*2F, dr]
                bases = self.basis.permute(0, 2, 1).reshape(-1, self.basis.shape[1])
                keys = FixedOrderLinear.from_weight(bases.to(dtype).contiguous())
            mix = heads.transpose(1, 2).contiguous()  # [H, 2F, dr]
            self._weights[dtype] = _Weights(heads, fused.head_pack(heads), keys, mix, fused.head_pack(mix))
        return self._weights[dtype]


@dataclass(frozen=True)
class _Weights:
    heads: torch.Tensor  # [H, dr, 2F]: each query head's group basis
    heads_packed: torch.Tensor  # fused.head_pack(heads) (empty where not AMX)
    keys: FixedOrderLinear | None  # dr -> G*2F: the groups' bases as one linear; None where qlinear is not built
    mix: torch.Tensor  # [H, 2F, dr]: each query head's group basis, transposed (un-mixed -> shared)
    mix_packed: torch.Tensor  # fused.head_pack(mix)


def find(rows: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool) -> RopeGroups | None:
    """rows [H, dr, K]: each head's query rope rows (a bias as one more column), inv_freq [dr/2]
    each rope pair's frequency -> the groups, or None where the structure does not hold or gains
    nothing (no frequency with two or more pairs)."""
    heads, dr = rows.shape[:2]
    if dr == 0:
        return None
    tol = 2 * torch.finfo(rows.dtype).eps  # rank 1 up to the weight's own rounding
    half = dr // 2
    slot = torch.arange(half)
    dims = torch.stack((2 * slot, 2 * slot + 1) if interleaved else (slot, slot + half), dim=-1)  # [dr/2, 2]
    w = rows.double()[:, dims]  # [H, dr/2, 2, K]
    freqs = inv_freq.unique()
    if len(freqs) == half:
        return None
    directions = []  # per frequency: its slots and each head's unit direction over them
    for f in freqs:
        slots = (inv_freq == f).nonzero().flatten()
        m = w[:, slots].flatten(2)  # [H, n, 2K]
        u, s, _ = torch.linalg.svd(m, full_matrices=False)
        if (s[:, 0] <= 0).any() or (len(slots) > 1 and (s[:, 1] > tol * s[:, 0]).any()):
            return None
        c = u[..., 0]  # [H, n], sign fixed by its largest entry
        directions.append((slots, c * c.gather(1, c.abs().argmax(1, keepdim=True)).sign()))
    same = torch.stack([(c @ c.T).abs() >= 1 - tol for _, c in directions]).all(0)  # [H, H]
    group = [int(same[h].nonzero()[0]) for h in range(heads)]  # each head's first look-alike
    leaders = sorted(set(group))
    per = heads // len(leaders)
    if heads % len(leaders) or any(group[h] != leaders[h // per] for h in range(heads)):
        return None  # not consecutive equal groups
    basis = torch.zeros(len(leaders), dr, 2 * len(freqs), dtype=torch.float64)
    for i, (slots, c) in enumerate(directions):
        for g, leader in enumerate(leaders):
            for side in range(2):
                basis[g, dims[slots, side], 2 * i + side] = c[leader]
    slots = torch.stack([(inv_freq == f).nonzero()[0, 0] for f in freqs])
    return RopeGroups(basis.float(), per, slots)
