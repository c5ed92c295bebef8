"""What an MLA layer does differently for a model converted from GQA (latentkv/convert/): savings
the loaded weights allow, found on them once per weight version, so a DeepSeek checkpoint takes none
of them (its answers: no rope groups, its nope part, one kv row per head, kv_b_proj as it is).

- **Grouped rope keys** (model/rope_groups.py): an exact conversion's shared rope key holds one pair
  per source KV head at each frequency; each query head reads one direction of it, so the prefill
  attends with the key un-mixed per group. A packed query projection is folded at load to give the
  un-mixed rope query itself (`folded`); decode and the naive path mix it back (`full_rope`).
- **No zero nope part** (`scores_nope`): where W_UK is all zero (the exact conversion keeps dn = 2
  zero dims for the format) the prefill kernels attend with dn = 0.
- **One kv row per group** (`kv_groups`): where consecutive heads' kv_b_proj rows are equal (a GQA
  source's values, one per source KV head) the prefill expands one row per group.
- **The padded kv_b_proj** (`padded_kv_b`): bf16 on AMX with a rank off the tile depth (the default
  conversion's 240), kv_b_proj's weight zero-padded to a multiple of 32 columns.

`ConvertedStructure` is a base class of model/mla.py's `MLAttention`; it reads the layer's
`n_heads`, `dn`, `dr`, `dv`, `kv_rank`, `q_lora_rank`, `fused`, `split`, `inv_freq`, `interleaved`,
`kv_b_proj` and `q_linear()`, and keeps its findings on the layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..cpu import features
from ..kernels import qlinear
from . import fused
from .quant import FixedOrderLinear, QuantLinear
from .rope_groups import RopeGroups, find as find_rope_groups


def weight_version(weight: torch.Tensor) -> tuple[int, int]:
    """What changes when a weight is loaded or trained in place: a cached copy of it is stale when this does."""
    return weight.data_ptr(), 0 if weight.is_inference() else weight._version


class ConvertedStructure:
    """The converted-model members of an MLA layer (the module docstring says which it reads)."""

    def init_structure(self) -> None:
        """Called once the layer's modules are built: nothing found yet."""
        # the prefill's grouped rope keys (model/rope_groups.py): (query weight version, groups or None).
        # A packed query projection (fixed-order or quantized) hands its float rows over before it packs
        # them, and packs them folded (rope_groups.fold: the un-mixed rope query, a third of the rows;
        # a quantized one quantizes the folded rows: its output is the un-mixed query whatever its noise)
        self._rope_groups = (None, None)
        self.folded = False  # the query projection gives the un-mixed rope query [T, H, 2F] (fold)
        # (kv_b_proj weight version, whether its key rows are not all zero, heads per kv row, the span
        # expansion to those rows): kv_b_facts
        self._kv_b = (None, True, 1, None)
        # (weight version, kv_b_proj's weight zero-padded to the AMX tile depth, its qlinear pack): padded_kv_b
        self._padded = (None, None, None)
        if isinstance(self.q_linear(), QuantLinear):
            self.q_linear().before_pack = self._keep_rope_groups

    def find_structure(self) -> None:
        """Once loaded: the rope groups and kv_b_proj's facts found now, not at the first prompt."""
        self.rope_groups(), self.kv_b_facts()

    def scores_nope(self) -> bool:
        """Whether q_nope · k_nope adds to the scores: False where W_UK (kv_b_proj's key rows) is all
        zero, as in the exact conversion of a model whose keys are all rotated (it keeps dn = 2 zero
        dims for the format): the prefill kernel then attends without them. True under autograd."""
        return self.kv_b_facts()[0]

    def kv_groups(self) -> tuple[int, nn.Module | None]:
        """(heads per kv row, the span expansion [S, kv_rank] -> [S, H / per * (dn' + dv)]) where
        consecutive heads' kv_b_proj rows are equal (those the prefill reads: dn' = dn where
        scores_nope, else 0), as in the exact conversion of a GQA model (its values per source KV
        head): the prefill expands and packs one row per group (the kernels take kv [S, Hk, ...]).
        (1, None) elsewhere, under autograd, or without latentkv's linear kernel."""
        return self.kv_b_facts()[1:]

    def kv_b_facts(self) -> tuple[bool, int, nn.Module | None]:
        """(scores_nope, *kv_groups), checked once per kv_b_proj weight version."""
        weight = self.kv_b_proj.weight
        if torch.is_grad_enabled():
            return self.dn > 0, 1, None
        version = weight_version(weight)
        if self._kv_b[0] != version:
            self._kv_b = (version, *self._find_kv_groups(weight.detach().view(self.n_heads, self.dn + self.dv, -1)))
        return self._kv_b[1:]

    def _find_kv_groups(self, w: torch.Tensor) -> tuple[bool, int, nn.Module | None]:
        """w [H, dn + dv, kv_rank] -> kv_b_facts()."""
        nope = self.dn > 0 and bool(w[:, : self.dn].any())
        used = w if nope else w[:, self.dn :]
        per = next(
            (
                p
                for p in range(self.n_heads, 1, -1)
                if self.n_heads % p == 0 and torch.equal(used, used[::p].repeat_interleave(p, 0))
            ),
            1,
        )
        if per == 1 or not qlinear.available():
            return nope, 1, None
        return nope, per, FixedOrderLinear.from_weight(used[::per].reshape(-1, w.shape[-1]).contiguous())

    def rope_groups(self) -> RopeGroups | None:
        """The grouped rope keys the prefill kernel may attend with (model/rope_groups.py), found once
        per query weight version (those the query projection was folded with, always); None under
        autograd, without the native ops, or where the structure does not hold."""
        if self.folded:
            return self._rope_groups[1]
        if not self.fused or torch.is_grad_enabled():
            return None
        linear = self.q_linear()
        weight = linear._parameters.get("weight")  # gone once a quantized linear packed (kept by _keep_rope_groups)
        if weight is not None and self._rope_groups[0] != weight_version(weight):
            self._rope_groups = (weight_version(weight), self._find_rope_groups(weight, linear.bias))
        return self._rope_groups[1]

    def _keep_rope_groups(self, weight: torch.Tensor, bias: torch.Tensor | None):
        """q_linear()'s before_pack: its groups, found while its float rows are still there, and
        with the native ops the folded rows it packs instead (None: it packs its own)."""
        groups = self._find_rope_groups(weight, bias)
        self._rope_groups = ("packed", groups)
        if groups is None or not self.fused:
            return None
        self.folded = True
        if not self.q_lora_rank:  # the packed projection's q part (q_b_proj's output is all q)
            self.split[0] = self.n_heads * (self.dn + groups.basis.shape[2])
        return groups.fold(weight, bias, self.dn)

    def grouped_rope(self, q_rope: torch.Tensor) -> torch.Tensor:
        """The rotated rope query as project() gives it -> [T, H, 2F] in each head's group basis where
        rope_groups() holds (a folded projection gives it so: as it is); else as it is."""
        groups = self.rope_groups()
        return groups.queries(q_rope) if groups is not None and not self.folded else q_rope

    def full_rope(self, q_rope: torch.Tensor) -> torch.Tensor:
        """The rotated rope query as project() gives it -> [..., H, dr] over the shared key (mixed
        back where the projection is folded: decode, the naive path)."""
        if not self.folded:
            return q_rope
        return self._rope_groups[1].mix(q_rope.reshape(-1, *q_rope.shape[-2:])).view(*q_rope.shape[:-1], self.dr)

    def rotate_folded(self, q_rope: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """A folded projection's un-mixed rope query [T, H, 2F] rotated: pair f turns at frequency f
        (its slot of cos, sin [T, dr/2]); interleaved by construction."""
        return fused.rope(q_rope, *rope, True, kernel=True, slots=self._rope_groups[1].slots)

    @torch.no_grad()
    def _find_rope_groups(self, weight: torch.Tensor, bias: torch.Tensor | None) -> RopeGroups | None:
        """weight [rows, K] (bias [rows]) of q_linear() -> the groups of its query rope rows."""
        q = weight[: self.split[0]].detach()
        if bias is not None:
            q = torch.cat((q, bias[: self.split[0], None].detach().to(q.dtype)), dim=1)
        rows = q.view(self.n_heads, self.dn + self.dr, -1)[:, self.dn :]
        return find_rope_groups(rows, self.inv_freq, self.interleaved)

    def padded_expand(self, rows: torch.Tensor) -> torch.Tensor | None:
        """expand_latent through padded_kv_b(): rows [..., kv_rank + dr] -> [..., H * (dn + dv)], the
        first rope values filling the pad (times zero: the same sums), a view of the rows, no copy;
        on latentkv's tile kernel where it runs (a row's bits fixed whatever the rows beside it;
        oneDNN picks its kernels by M). None where the padded weight does not apply."""
        weight = self.padded_kv_b()
        if weight is None:
            return None
        x, packed = rows[..., : weight.shape[1]], self._padded[2]
        if packed is not None and x.dim() == 2:
            return qlinear.linear(x, packed, 16, weight.shape[0])
        return F.linear(x, weight)

    def padded_kv_b(self) -> torch.Tensor | None:
        """kv_b_proj's weight [H * (dn + dv), kv_rank] zero-padded to a multiple of 32 columns,
        cached while the weight is unchanged; None where it does not apply (no AMX: measured only
        there; not bf16, autograd through it, a rank on the grid, or a rope key too short to fill
        the pad). oneDNN runs K = 256 at ~1.6x the speed of K = 240 on AMX; latentkv's tile kernel
        as fast at 2,048 rows and 1.5x at 256."""
        linear, depth = self.kv_b_proj, -(-self.kv_rank // 32) * 32
        if (
            not features()["amx_bf16"]
            or type(linear) is not nn.Linear
            or linear.bias is not None
            or linear.weight.dtype != torch.bfloat16
            or depth == self.kv_rank
            or depth > self.kv_rank + self.dr
            or torch.is_grad_enabled()
        ):
            return None
        version = weight_version(linear.weight)
        if self._padded[0] != version:
            padded = F.pad(linear.weight.detach(), (0, depth - self.kv_rank)).contiguous()
            self._padded = (version, padded, qlinear.pack_bf16(padded) if qlinear.runs_amx() else None)
        return self._padded[1]
