// The parts of torch a latentkv extension uses (tensors, dtype dispatch, at::parallel_for, the
// pybind11 tensor caster), instead of <torch/extension.h>: that header pulls in the whole C++
// frontend, ~18 of the ~23 CPU-seconds each extension took to build (g++ 12, -O3), and a
// first start builds two of them.
#pragma once
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>
