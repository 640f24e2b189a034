// Arrays from Python (numpy through the buffer protocol, torch and any
// DLPack object) as the library takes a tensor's bytes: checked row-major,
// their safetensors dtype named, read in place. Shared by the publishers'
// bindings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "hfdelta/publisher.hpp"

namespace hfdelta::python {

using Array = nanobind::ndarray<nanobind::ro>;  // any device: the host's, or a CUDA device's

// One tensor as the library takes it. `dtype`, `shape`: given by the Python
// side for arrays DLPack cannot describe (ml_dtypes' bfloat16 and float8
// arrays arrive as their uint8 view).
struct Tensor {
  std::string name, dtype;
  std::vector<std::uint64_t> shape;
  const std::uint8_t* data = nullptr;
  std::size_t nbytes = 0;
  int device_type = nanobind::device::cpu::value, device_id = 0;
  TensorBytes view() const { return {name, dtype, shape, {data, nbytes}}; }
  bool on_cuda() const { return device_type == nanobind::device::cuda::value; }
};

// Error(usage) for an array not row-major, a dtype safetensors has no name
// for, or memory neither the host's nor (with HFDELTA_CUDA) a CUDA device's.
Tensor tensor_of(std::string name, const Array& a, const std::optional<std::string>& dtype,
                 const std::optional<std::vector<std::uint64_t>>& shape);

}  // namespace hfdelta::python
