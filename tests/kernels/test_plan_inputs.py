"""The decode plan's inputs (kernels/csrc/decode_ops/plan_layer.h): typed structs declared once, built by
name; a field misnamed, of the wrong type or missing is refused when the plan is built, naming it."""

from dataclasses import fields

import pytest
import torch

from latentkv.kernels import attention as attention_kernels, decode_ops, qlinear
from latentkv.model import decode_plan
from latentkv.model.loader import load_model
from latentkv.model.route import decide_route
from latentkv.model.spec import LayerSpec
from latentkv.cache.latent_cache import allocate_caches

pytestmark = pytest.mark.skipif(
    not decode_ops.available(), reason=f"fused ops not built: {decode_ops.unavailable_reason()}"
)


def ext():
    return decode_ops.extension()


def test_a_misnamed_field_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"PlanLayer: no field n_head \(its fields: w_in, w_post, .*n_heads"):
        ext().PlanLayer(n_head=4)
    with pytest.raises(TypeError, match="PlanLinear: no field weight"):
        ext().PlanLinear(weight=torch.zeros(1))


def test_a_field_of_the_wrong_type_is_refused_naming_it():
    with pytest.raises(TypeError, match="PlanLayer.n_heads: expected an int, got str"):
        ext().PlanLayer(n_heads="4")
    with pytest.raises(TypeError, match="PlanLayer.interleaved: expected a bool, got int"):
        ext().PlanLayer(interleaved=1)
    with pytest.raises(TypeError, match="PlanLayer.w_in: expected a tensor or None, got list"):
        ext().PlanLayer(w_in=[1.0])
    with pytest.raises(TypeError, match="PlanLayer.qkv_a: expected PlanLinear, got tuple"):
        ext().PlanLayer(qkv_a=(torch.zeros(1), 32, 4, None))


def test_a_missing_field_is_refused_naming_it():
    with pytest.raises(ValueError, match="PlanLinear: missing out$"):
        ext().PlanLinear(packed=torch.zeros(1), kind=32)
    ext().PlanLinear(packed=torch.zeros(1), kind=32, out=4)  # bias is optional
    with pytest.raises(ValueError, match="PlanLayer: missing w_post, w_uk, .*block_size"):
        ext().PlanLayer(w_in=torch.ones(4))


def test_the_spec_fields_are_layer_spec_fields():
    """What the plan reads of a layer's shapes and constants it reads from LayerSpec, under its names."""
    plan_fields = ext().PlanLayer.FIELDS.split(", ")
    assert set(decode_plan.SPEC_FIELDS) <= {f.name for f in fields(LayerSpec)}
    assert set(decode_plan.SPEC_FIELDS) <= set(plan_fields)
    assert len(plan_fields) == len(set(plan_fields))


@pytest.mark.skipif(
    not (qlinear.available() and attention_kernels.available()), reason="qlinear and attention kernels not built"
)
@torch.no_grad()
def test_building_a_plan_with_a_field_it_does_not_have_fails_there(tiny_checkpoints, monkeypatch):
    folder, _ = tiny_checkpoints("v2_dense")
    model = load_model(str(folder), route=decide_route("cpu", torch.float32, "native", "int4"))
    caches = allocate_caches(model.config, 4, 4, model.dtype, "int8", "cpu")
    plan, reason = decode_plan.build(model, caches)
    assert plan is not None, reason
    monkeypatch.setattr(decode_plan, "SPEC_FIELDS", decode_plan.SPEC_FIELDS + ("hidden",))
    with pytest.raises(TypeError, match="PlanLayer: no field hidden"):
        decode_plan.build(model, caches)
