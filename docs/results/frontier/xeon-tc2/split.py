"""Per-side water-filling (centred) with the layer's bits split between the latent and the rope key at other shares."""
from pathlib import Path
import json, sys, time
sys.path.insert(0, str(Path(__file__).parent))
from common import Judge, centred_energies, means
from latentkv.convert import bit_alloc

n = int(sys.argv[1]); budgets = [int(b) for b in sys.argv[2].split(",")]; shares = [float(s) for s in sys.argv[3].split(",")]
judge = Judge("heldout", n)
for b in budgets:
    for share in shares:
        def side_budgets(sizes, kv_bytes, share=share):
            out = []
            for i, (r, dr) in enumerate(sizes):
                layer_bits = 8 * (kv_bytes // len(sizes) + (i < kv_bytes % len(sizes)))
                rope = int(layer_bits * share)
                out.append((layer_bits - rope, rope))
            return out
        bit_alloc.side_budgets = side_budgets
        code = bit_alloc.allocate_sides(centred_energies, b).centred([m[0] for m in means], [m[1] for m in means])
        agree, kl = judge.score(code)
        print(json.dumps({"kv_bytes": b, "rope_share": share, "bytes": code.bytes_per_token(), "agreement": agree, "kl": kl, "desc": code.describe()}), flush=True)
