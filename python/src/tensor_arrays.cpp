#include "tensor_arrays.hpp"

#include "hfdelta/error.hpp"

namespace nb = nanobind;

namespace hfdelta::python {

namespace {

// The safetensors dtype of a DLPack dtype ("" when safetensors has none).
std::string safetensors_dtype(nb::dlpack::dtype d) {
  using Code = nb::dlpack::dtype_code;
  if (d.lanes != 1) return "";
  const auto code = static_cast<Code>(d.code);
  const std::string bits = std::to_string(d.bits);
  switch (code) {
    case Code::Float:
      return d.bits == 16 || d.bits == 32 || d.bits == 64 ? "F" + bits : "";
    case Code::Bfloat:
      return d.bits == 16 ? "BF16" : "";
    case Code::Int:
      return d.bits == 8 || d.bits == 16 || d.bits == 32 || d.bits == 64 ? "I" + bits : "";
    case Code::UInt:
      return d.bits == 8 || d.bits == 16 || d.bits == 32 || d.bits == 64 ? "U" + bits : "";
    case Code::Bool:
      return d.bits == 8 ? "BOOL" : "";
    default:
      return "";
  }
}

// Row-major and dense: the bytes the safetensors file holds, in one piece.
bool row_major(const Array& a) {
  for (std::size_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) == 0) return true;  // no bytes: any strides will do
  std::int64_t want = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != want) return false;
    want *= static_cast<std::int64_t>(a.shape(i));
  }
  return true;
}

}  // namespace

Tensor tensor_of(std::string name, const Array& a, const std::optional<std::string>& dtype,
                 const std::optional<std::vector<std::uint64_t>>& shape) {
  Tensor t;
  t.name = std::move(name);
  const std::string where = "tensor '" + t.name + "'";
  if (!row_major(a))
    fail(Exit::usage, where +
                          ": not contiguous in row-major order (give a contiguous copy: numpy.ascontiguousarray, "
                          "Tensor.contiguous())");
  t.dtype = dtype ? *dtype : safetensors_dtype(a.dtype());
  if (t.dtype.empty())
    fail(Exit::usage, where + ": a DLPack dtype (code " + std::to_string(a.dtype().code) + ", " +
                          std::to_string(a.dtype().bits) + " bits) that safetensors has no name for");
  if (shape)
    t.shape = *shape;
  else
    for (std::size_t i = 0; i < a.ndim(); ++i) t.shape.push_back(a.shape(i));
  t.data = static_cast<const std::uint8_t*>(a.data());
  t.nbytes = a.nbytes();
  t.device_type = a.device_type(), t.device_id = a.device_id();
  if (t.device_type != nb::device::cpu::value && !t.on_cuda())
    fail(Exit::usage, where + ": not in host memory nor on a CUDA device (DLPack device (" +
                          std::to_string(t.device_type) + ", " + std::to_string(t.device_id) +
                          ")): copy it to the host first");
#ifndef HFDELTA_CUDA
  if (t.on_cuda())
    fail(Exit::usage, where + ": on a CUDA device (DLPack device (2, " + std::to_string(t.device_id) +
                          ")), but this build of hfdelta has no CUDA (built without -Dcuda): copy it to the host first "
                          "(torch: .cpu())");
#endif
  return t;
}

}  // namespace hfdelta::python
