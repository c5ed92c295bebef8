"""latentkv's native CPU kernels: one module per family (attention: paged MLA decode and the
invariant prefill; decode_ops: the fused per-layer ops and the decode plan's step; qlinear: the
packed int4 / int8 / float32 and integer-dot linears, a MoE layer's experts and its router; sample:
the sampler's rows), built, ISA-chosen, self-checked and given a fallback by build.py. Nothing here
imports the rest of latentkv but the user cache's location."""
