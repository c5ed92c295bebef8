"""The start-up line (engine/route.py) names each part of a step's route, as the code decides it."""

import pytest

from latentkv.engine.args import EngineArgs
from latentkv.engine.engine import LLMEngine
from latentkv.engine.route import describe
from latentkv.kernels import attention, decode_ops, qlinear
from latentkv.model.loader import load_model
from latentkv.model.route import decide_route


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"quantization": "w4a8", "kv_cache_dtype": "int8"},
        {"batch_invariant": False, "attention_backend": "torch", "enforce_eager": True},
    ],
    ids=["default", "w4a8-int8", "torch-eager"],
)
def test_the_route_line_names_dtype_cache_isas_backend_linears_plan_and_invariance(tiny_lm, capfd, options):
    folder, _, _ = tiny_lm()
    LLMEngine.from_args(EngineArgs(model=str(folder), dtype="float32", kv_cache_blocks=64, **options))
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("latentkv: route:")]
    assert len(lines) == 1
    line = lines[0]
    assert "dtype float32" in line
    assert f"cache {options.get('kv_cache_dtype', 'float32')}" in line
    # an extension the route uses names its ISA (or "unavailable"); one it does not use is "unused"
    uses = {
        attention: options.get("attention_backend", "auto") != "torch",
        decode_ops: True,
        qlinear: options.get("batch_invariant", True) or "quantization" in options,
    }
    for family, used in uses.items():
        isa = (family.EXT.choose() if family.available() else "unavailable") if used else "unused"
        assert f"{family.EXT.family} {isa}" in line
    backend = options.get("attention_backend", "native" if attention.available() else "torch")
    assert f"attention {backend} (prefill " in line and ", decode " in line
    if options.get("quantization") == "w4a8" and qlinear.available():
        assert "w4a8 (native)" in line
    assert "; linears layers " in line and "lm_head " in line
    assert "decode plan off (enforce_eager)" in line if options.get("enforce_eager") else "decode plan o" in line
    assert f"batch invariance {'off' if options.get('batch_invariant') is False else 'on'}" in line


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_the_route_line_says_how_moe_experts_run(tiny_checkpoints, batch_invariant):
    """Fixed-order linears: each MoE layer's experts in one native call (where qlinear builds); torch's
    linears: the per-expert loop. A dense model says nothing of MoE."""
    folder, _ = tiny_checkpoints("v2_lite_moe")
    model = load_model(folder, route=decide_route(batch_invariant=batch_invariant))
    native = batch_invariant and qlinear.available()
    assert f"; MoE experts {'native call' if native else 'per-expert loop'};" in describe(model, None)
    dense = load_model(tiny_checkpoints("v2_dense")[0])
    assert "MoE" not in describe(dense, None)
