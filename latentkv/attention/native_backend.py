"""The native CPU backend: the reference backend with its absorbed attention (paged MLA decode)
and its batch-invariant prompt rows in C++ (kernels/attention.py has the kernels, their ISA paths and
their build). Where they cannot be built, `available()` is False and `get_backend("auto")` picks the
PyTorch reference (kernels/build.py says why, once).
"""

from __future__ import annotations

import torch

from ..cache import coded, q4
from ..kernels.attention import (
    available,
    kernel_path,
    mla_decode,
    mla_decode_coded,
    mla_prefill,
    prefill_finish,
    prefill_supported,
    unavailable_reason,
)
from .layer_api import AttentionLayer
from .metadata import AttentionMetadata
from .prefill import span_prefill, span_prefill_many
from .torch_ref import QUERY_CHUNK, TorchBackend

MAX_QUERY_LEN = 16  # longer query blocks (prefill chunks) are matmul-shaped: the reference's bmm wins


class NativeBackend(TorchBackend):
    """The reference backend with its absorbed attention (paged MLA decode) in C++: no gather,
    no padding, each latent row read once for all heads; batch-invariant prompt rows by the native
    prefill kernel (span by span), float32 and bf16 on every ISA. Other prefill paths stay the
    reference's."""

    name = "native"

    def __init__(self):
        if not available():
            raise RuntimeError(f"the native attention backend is not available here ({unavailable_reason()})")
        self.prefill_kernel = mla_prefill
        self.coded = CodedBackend()  # a transform-coded cache (format.native_read False): its own decode kernel

    def for_format(self, fmt) -> TorchBackend:
        return self if fmt.native_read else self.coded

    def forward(self, layer: AttentionLayer, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        if not cache.format.native_read:
            return self.coded.forward(layer, q_nope, q_rope, cache, meta)
        return super().forward(layer, q_nope, q_rope, cache, meta)

    @staticmethod
    def runs_prefill_kernel(dtype: torch.dtype, device: str) -> bool:
        """Whether prompt rows of this dtype take the native prefill kernel (else the reference's)."""
        return device == "cpu" and prefill_supported(dtype)

    @staticmethod
    def runs_decode_kernel(dtype: torch.dtype, device: str) -> bool:
        """Whether absorbed rows of this dtype take the native decode kernel (else the reference's)."""
        return device == "cpu" and dtype in (torch.float32, torch.bfloat16)

    def prefill_route(self, dtype: torch.dtype, device: str, invariant: bool) -> str:
        if not self.runs_prefill_kernel(dtype, device):
            return super().prefill_route(dtype, device, invariant)
        spans = f"native spans ({kernel_path(dtype)})"
        return spans if invariant else f"{spans} for one sequence's chunks, else naive or absorbed by cost"

    def decode_route(self, dtype: torch.dtype, device: str, invariant: bool) -> str:
        if not self.runs_decode_kernel(dtype, device):
            return super().decode_route(dtype, device, invariant)
        return f"native kernel ({kernel_path(dtype)})"

    def prompt_attention(self, layer: AttentionLayer, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        if self.runs_prefill_kernel(q_nope.dtype, q_nope.device.type):
            return span_prefill(layer, q_nope, q_rope, cache, meta, self.prefill_kernel, prefill_finish)
        return super().prompt_attention(layer, q_nope, q_rope, cache, meta)

    def attend_groups(self, layer: AttentionLayer, q_nope, q_rope, cache, groups: list, out: torch.Tensor) -> None:
        # Sequences whose new rows are all prompt rows go through the prefill kernel together: their
        # latent reads, expansions and rope keys one call each per span (row by row the same bits),
        # ~a sixth of a prefill step of 32 x 256 prompts as 32 calls each
        whole, rest = [], []
        for g in groups:
            prompt = g[1].num_seqs == 1 and g[1].prompt_rows is not None and g[1].prompt_rows[0] == g[1].max_query_len
            (whole if prompt else rest).append(g)
        if len(whole) > 1 and self.runs_prefill_kernel(q_nope.dtype, q_nope.device.type):
            span_prefill_many(layer, q_nope, q_rope, cache, whole, self.prefill_kernel, out, prefill_finish)
            groups = rest
        super().attend_groups(layer, q_nope, q_rope, cache, groups, out)

    def attend(self, layer: AttentionLayer, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        # Outside batch-invariant mode too, one sequence's prefill chunk (with or without cached
        # context) takes the prompt kernel: faster than SDPA's flash (bf16 on avx512_bf16 ~5x at
        # 4K, float32 on avx2 ~1.3-1.4x) and than the tiled latent path, and memory-bounded.
        if (
            meta.path == "auto"
            and not meta.invariant
            and meta.num_seqs == 1
            and meta.max_query_len > MAX_QUERY_LEN
            and self.runs_prefill_kernel(q_nope.dtype, q_nope.device.type)
        ):
            return span_prefill(layer, q_nope, q_rope, cache, meta, self.prefill_kernel, prefill_finish)
        return super().attend(layer, q_nope, q_rope, cache, meta)

    def latent_attention(self, query, cache, meta: AttentionMetadata) -> torch.Tensor:
        if (
            not self.runs_decode_kernel(query.dtype, query.device.type)
            or meta.max_query_len > MAX_QUERY_LEN
            and not meta.invariant
        ):
            return super().latent_attention(query, cache, meta)
        heads = query.shape[1] // meta.max_query_len
        if cache.format.turned_rope:  # (cache/q4.py): turning the query's rope part too keeps the scores
            query = torch.cat((query[..., : cache.kv_rank], q4.turn(query[..., cache.kv_rank :])), dim=-1)
        if meta.max_query_len == 1:
            return mla_decode(query, cache, meta.block_tables, meta.context_lens, None, heads)
        # Batch-invariant: every row through the kernel (its spans sit at fixed positions), in
        # QUERY_CHUNK-token slices so its per-span buffers stay bounded; rows are independent.
        parts = [
            mla_decode(
                query[:, first * heads : (first + QUERY_CHUNK) * heads].contiguous(),
                cache,
                meta.block_tables,
                meta.context_lens,
                meta.query_pos[:, first : first + QUERY_CHUNK].contiguous(),
                heads,
            )
            for first in range(0, meta.max_query_len, QUERY_CHUNK)
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


class CodedBackend(NativeBackend):
    """A transform-coded cache (cache/coded.py): decode rows through the native kernel that widens the
    codes as it reads them (kernels/attention.py mla_decode_coded), the query turned into the code's basis
    and the output turned back (coded.kernel_view); prompt rows through the native prefill spans over the
    rows dequantized a span at a time (attention/paged.py read_spans: no prefill kernel reads the codes)."""

    name = "native coded"

    def __init__(self):
        self.prefill_kernel = mla_prefill  # (NativeBackend's, without a coded backend of its own)

    def for_format(self, fmt) -> TorchBackend:
        return self

    def forward(self, layer: AttentionLayer, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        return TorchBackend.forward(self, layer, q_nope, q_rope, cache, meta)

    def decode_route(self, dtype: torch.dtype, device: str, invariant: bool) -> str:
        if device != "cpu":
            return super().decode_route(dtype, device, invariant)
        return f"native coded kernel ({kernel_path(dtype)})"

    @staticmethod
    def runs_kernel(query: torch.Tensor, meta: AttentionMetadata) -> bool:
        """Whether these rows take the native kernel (else the reference over dequantized rows)."""
        return query.device.type == "cpu" and (meta.max_query_len <= MAX_QUERY_LEN or meta.invariant)

    def absorbed_attention(self, layer: AttentionLayer, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        # the layer folds the code's turn into W_UK and W_UV (layer_api.LatentTurn): the query comes out in
        # the kernel's row, the kernel's output goes straight to the values, with no turn of its own
        if not self.runs_kernel(q_nope, meta):
            return super().absorbed_attention(layer, q_nope, q_rope, cache, meta)
        view = coded.kernel_view(cache.format.code)
        out = coded_kernel(layer.absorb(q_nope, q_rope, view), cache, meta)
        return layer.unabsorb(out, q_nope.shape[1], view)

    def latent_attention(self, query, cache, meta: AttentionMetadata) -> torch.Tensor:
        if not self.runs_kernel(query, meta):
            return TorchBackend.latent_attention(self, query, cache, meta)
        return coded_latent_attention(query, cache, meta)


def coded_latent_attention(query, cache, meta: AttentionMetadata, path: str | None = None) -> torch.Tensor:
    """query [B, Q*H, r+dr] (absorbed, scaled) over a transform-coded layer -> o_lat [B, Q*H, r] in the query
    dtype: the query turned into the kernel's row (coded.kernel_view, in float32, then the query dtype), the
    kernel (`path`: a named path instead of the one that serves), its output turned back in float32. (The
    layers fold the turns into their weights instead: CodedBackend.absorbed_attention.)"""
    view = coded.kernel_view(cache.format.code)
    b, rows, width = query.shape
    turned = view.turn_query(query.reshape(-1, width)).view(b, rows, -1)
    turned = turned.to(query.dtype)  # bf16 rows take the bf16 dot-product and tile loops
    out = coded_kernel(turned, cache, meta, path)
    return view.turn_back(out.view(b * rows, -1)).view(b, rows, -1).to(query.dtype)


def coded_kernel(turned, cache, meta: AttentionMetadata, path: str | None = None) -> torch.Tensor:
    """turned [B, Q*H, row width] (the query in the code's row: coded.kernel_view) -> the kernel's output
    [B, Q*H, latent columns] in the code's basis, in the query dtype; `path`: as coded_latent_attention."""
    view = coded.kernel_view(cache.format.code)
    heads = turned.shape[1] // meta.max_query_len
    cs = view.cs(int(meta.context_lens.max()))
    args = (cache.latent, cache.scale, view.runs, view.steps, cs, view.latent_columns, meta.block_tables)
    if meta.max_query_len == 1:
        out = mla_decode_coded(turned, *args, meta.context_lens, None, heads, path)
    else:  # rows at their positions, QUERY_CHUNK tokens at a time (as NativeBackend.latent_attention)
        out = torch.cat(
            [
                mla_decode_coded(
                    turned[:, first * heads : (first + QUERY_CHUNK) * heads].contiguous(),
                    *args,
                    meta.context_lens,
                    meta.query_pos[:, first : first + QUERY_CHUNK].contiguous(),
                    heads,
                    path,
                )
                for first in range(0, meta.max_query_len, QUERY_CHUNK)
            ],
            dim=1,
        )
    return out
