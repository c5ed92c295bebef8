"""What an attention backend may call on the layer it serves: the `AttentionLayer` protocol.

`backend.forward(layer, ...)` (backend.py) and the prefill paths (prefill.py, native_backend.py)
call back into the layer for the math in the paper's names; these are all the members they may
use. model/mla.py's `MLAttention` satisfies it (tests/attention/test_layer_api.py checks every
member and that the attention package calls nothing else on a layer). The structural members
(`rope_groups`, `kv_groups`, `scores_nope`, `grouped_rope`) describe savings an exact conversion of
a GQA model allows (model/converted.py); a DeepSeek checkpoint answers "none": None, (1, None), True,
the query as it is.

Shapes: T flat rows, B sequences, Q query rows each, H heads, dn / dr / dv the nope, rope and value
widths per head, r the latent rank (`kv_rank`), L cached positions, S a span of cached positions.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

import torch


@runtime_checkable
class GroupedRopeKeys(Protocol):
    """A converted GQA model's shared rope key un-mixed per source KV head (model/rope_groups.py
    `RopeGroups`): G groups, each 2F values a head (F frequencies)."""

    def keys(self, k_r: torch.Tensor) -> torch.Tensor:
        """k_r [S, dr] (rotated) -> [S, G, 2F] contiguous: every group's un-mixed rope key."""
        ...


@runtime_checkable
class LatentTurn(Protocol):
    """A cache that holds the latent in another basis, read there (a transform code: cache/coded.py
    KernelView): the layer folds the turn into its absorbed weights (the query comes out in the cache's
    basis, the values go back from it), so no query or output is turned on its own."""

    latent_map: torch.Tensor  # [C, r] float32: the latent query's C columns in the cache's basis (q' = M q)
    out_map: torch.Tensor  # [r, C] float32: a latent output back from the cache's basis (o = M o')
    latent_mean: torch.Tensor | None  # [r] float32: what each value row adds back (None: nothing)

    def turn_rope(self, q_rope: torch.Tensor) -> torch.Tensor:
        """The rope query [..., dr] -> its columns in the cache's basis [..., E], in its dtype."""
        ...


@runtime_checkable
class AttentionLayer(Protocol):
    """One MLA layer as a backend sees it."""

    n_heads: int  # H
    kv_rank: int  # r: the latent c's width
    dn: int  # per head: the query / key part without rope
    dr: int  # the rope part (one key shared by all heads)
    dv: int  # the value
    scale: float  # the softmax scale (YaRN's mscale² included)

    def absorb(self, q_nope: torch.Tensor, q_rope: torch.Tensor, turn: LatentTurn | None = None) -> torch.Tensor:
        """q_nope [B, Q, H, dn], q_rope [B, Q, H, dr] (as the layer projected it) -> the latent
        query [B, Q*H, r + dr]: W_UKᵀ q_nope beside the rope query, the softmax scale applied; with a
        turn, in its basis [B, Q*H, C + E]."""
        ...

    def unabsorb(self, o_lat: torch.Tensor, q: int, turn: LatentTurn | None = None) -> torch.Tensor:
        """o_lat [B, Q*H, r] (attention output in latent space; with a turn [B, Q*H, C] in its basis),
        Q = q -> W_UV o_lat [B, Q, H, dv]."""
        ...

    def expand(self, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached rows kv [B, L, r + dr] -> per-head keys [B, L, H, dn + dr] and values [B, L, H, dv]
        (W_kvb; the naive path)."""
        ...

    def expand_latent(self, rows: torch.Tensor) -> torch.Tensor:
        """kv_b_proj of cached rows' latents: rows [..., r + dr] -> [..., H * (dn + dv)]; a row's
        bits do not depend on the rows beside it (the prefill kernels' spans)."""
        ...

    def full_rope(self, q_rope: torch.Tensor) -> torch.Tensor:
        """The rotated rope query as the layer projected it -> [..., H, dr] over the shared rope key
        (decode and the naive path)."""
        ...

    def grouped_rope(self, q_rope: torch.Tensor) -> torch.Tensor:
        """The rotated rope query as projected [T, H, *] -> [T, H, 2F] in each head's group basis
        where `rope_groups()` is not None; else as it is ([T, H, dr])."""
        ...

    def rope_groups(self) -> GroupedRopeKeys | None:
        """The grouped rope keys the prefill kernels may attend with, or None (the shared key)."""
        ...

    def scores_nope(self) -> bool:
        """Whether q_nope · k_nope adds to the scores: False where W_UK is all zero (the prefill
        kernels then attend with dn = 0)."""
        ...

    def kv_groups(self) -> tuple[int, Callable[[torch.Tensor], torch.Tensor] | None]:
        """(heads per kv row, the expansion latent [S, r] -> [S, H / per * (dn' + dv)]) where
        consecutive heads' kv_b_proj rows are equal (dn' = dn where `scores_nope()`, else 0);
        (1, None) elsewhere: `expand_latent` serves."""
        ...
