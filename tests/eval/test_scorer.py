"""`eval/scorer.py`: a model folder scored as `latentkv eval ppl` scores it."""

from __future__ import annotations

import math

import pytest
from tiny_lm import save_tiny_lm

from latentkv.eval.scorer import evaluate


def test_weight_quantized_scoring_stays_close(tmp_path):
    """`eval ppl --quantization` scores the model as it would be served with quantized linears."""
    save_tiny_lm(tmp_path, "v2_dense")
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    plain = evaluate(str(tmp_path), [str(text)], ctx=32, max_tokens=256)["ppl"]
    for kind in ("int8", "int4"):
        quant = evaluate(str(tmp_path), [str(text)], ctx=32, max_tokens=256, quantization=kind)["ppl"]
        assert quant != plain and abs(math.log(quant / plain)) < 0.1, (kind, plain, quant)
    bf16 = evaluate(str(tmp_path), [str(text)], ctx=32, max_tokens=256, dtype="bfloat16", quantization="int4")["ppl"]
    assert abs(math.log(bf16 / plain)) < 0.1, (plain, bf16)
    with pytest.raises(ValueError, match="quantization"):
        evaluate(None, [str(text)], ctx=32, max_tokens=64, quantization="int4")
