"""Stock latent widths: the kv_lora_rank + qk_rope_head_dim a serving engine takes.

vLLM's MLA layer accepts widths 320, 512 and 576 only (`MLACommonBackend.get_supported_head_sizes`);
its CPU backend and FlashMLA take 576 only. All of them assume a 64-dim rope key. A stock export of
another width converts fine but is refused at load time, so `--stock` snaps to a width the target
takes; a width above what the source needs is padded with zero latent dims (the same model).
"""

from __future__ import annotations

STOCK_ROPE_DIM = 64
TARGETS = {"vllm": (320, 512, 576), "vllm-cpu": (576,), "flashmla": (576,), "any": ()}


def snap_width(width: int, target: str) -> int:
    """The target's supported width nearest to `width` (a tie goes to the larger); "any": width."""
    if target not in TARGETS:
        raise ValueError(f"unknown stock target {target!r} ({', '.join(TARGETS)})")
    widths = TARGETS[target]
    return min(widths, key=lambda w: (abs(w - width), -w)) if widths else width


def stock_size(src, rope_dim, kv_rank, target: str, width: int | None = None) -> tuple[int | str, int | str, list[str]]:
    """(rope_dim, kv_rank, notes) of a stock export for `target`.

    rope_dim / kv_rank as the user gave them (kv_rank may be "full"); width forces
    kv_lora_rank + rope. Notes say what was snapped, padded, or larger than the source.
    """
    widths = TARGETS.get(target)
    if widths is None:
        raise ValueError(f"unknown stock target {target!r} ({', '.join(TARGETS)})")
    notes = []
    if not widths:
        if width is not None:
            rope_dim = STOCK_ROPE_DIM if rope_dim is None else rope_dim
            if rope_dim == "all" or width <= int(rope_dim):
                raise ValueError(f"--stock-width {width} needs a numeric rope dim below it, got {rope_dim}")
            kv_rank = width - int(rope_dim)
        return rope_dim, kv_rank, notes
    if rope_dim is not None and rope_dim != STOCK_ROPE_DIM:
        raise ValueError(
            f"--target {target} needs rope dim {STOCK_ROPE_DIM} (its MLA kernels assume it), "
            f"got {rope_dim}; use --target any for other shapes"
        )
    rope_dim = STOCK_ROPE_DIM
    kv_rank = "full" if kv_rank is None else kv_rank
    need = 2 * src.num_kv_heads * src.head_dim - rope_dim  # widest latent a stock plan can use
    if width is not None:
        if width not in widths:
            raise ValueError(
                f"--stock-width {width} is not one --target {target} takes ({', '.join(map(str, widths))})"
            )
        chosen = width
    elif kv_rank == "full":
        chosen = next((w for w in widths if w - rope_dim >= need), widths[-1])
        if chosen - rope_dim < need:
            notes.append(f"--kv-rank full needs a latent of {need}; {target} takes at most rank {chosen - rope_dim}")
    else:
        asked = int(kv_rank) + rope_dim
        chosen = snap_width(asked, target)
        if chosen != asked:
            notes.append(
                f"stock width {asked} snapped to {chosen} (rank {chosen - rope_dim} + rope {rope_dim}): "
                f"{target} takes {', '.join(map(str, widths))}"
            )
    ratio = chosen / src.kv_elements()
    if ratio > 1:
        notes.append(
            f"the {chosen}-wide stock cache is {ratio:.2f}x the source's {src.kv_elements()} elements "
            f"per token per layer: larger than the original (it is the width {target} serves)"
        )
    return rope_dim, chosen - rope_dim, notes
