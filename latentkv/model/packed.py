"""Linears that read the same input, built as one matmul (nano-vllm's packed modules).

q (or q_a) with kv_a in MLA, gate with up in the MLP: fewer, larger matmuls per decode
step. The checkpoint keeps the parts as separate tensors; `parts` says how they stack
(row blocks, in order) so the loader can map each tensor into its rows and the exporter
can cut them out again (loader.checkpoint_slots). A part without a bias has zeros there.
"""

from __future__ import annotations

from torch import nn


class PackedLinear(nn.Linear):
    def __init__(self, in_features: int, parts: list[tuple[str, int, bool]]):
        """parts: (checkpoint module name, out_features, has_bias) in row order."""
        super().__init__(in_features, sum(rows for _, rows, _ in parts), bias=any(bias for _, _, bias in parts))
        self.parts = parts
        self.sizes = [rows for _, rows, _ in parts]
