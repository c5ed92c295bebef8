// The decode plan (decode_step.cpp: a whole decode step's decoder layers in one call over decode_ops'
// kernels; its inputs: plan_layer.h), registered into decode_ops' module (decode_ops.cpp).
#pragma once
#include "torch_lite.h"

// Binds DecodePlan and its typed inputs (plan_layer.h: PlanLinear, PlanMoe, PlanCodedSide, PlanCoded, PlanLayer)
// into the module.
void register_decode_plan(py::module_& m);
