// Fuzz target: a whole safetensors file through the strict header reader.
//
// Refusing an input with hfdelta::Error is the expected outcome for most
// inputs. Any other exception, a sanitizer report, or an accepted header that
// breaks the format's rules (docs/format.md, "Checkpoint directories") is a finding.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/safetensors.hpp"

namespace {

// What must hold for every header the reader accepts.
void check_accepted(const hfdelta::SafetensorsHeader& h, std::string_view bytes) {
  FUZZ_CHECK(h.file_size == bytes.size());
  FUZZ_CHECK(h.header_len <= hfdelta::kMaxHeaderSize);
  FUZZ_CHECK(h.data_start() <= h.file_size);
  FUZZ_CHECK(h.header.size() == h.header_len);
  FUZZ_CHECK(bytes.substr(8, h.header_len) == h.header);
  FUZZ_CHECK(!h.header.empty() && h.header.front() == '{');
  if (!h.has_metadata) FUZZ_CHECK(h.metadata.empty());

  // Sorted tensors tile the data buffer exactly, and every tensor's bytes lie
  // inside the file.
  const std::uint64_t buffer = h.file_size - h.data_start();
  std::uint64_t pos = 0;
  std::set<std::string> names;
  for (const auto& t : h.tensors) {
    FUZZ_CHECK(t.name != "__metadata__");
    FUZZ_CHECK(names.insert(t.name).second);
    FUZZ_CHECK(t.begin == pos);
    FUZZ_CHECK(t.begin <= t.end);
    FUZZ_CHECK(t.end <= buffer);
    FUZZ_CHECK(h.file_offset(t) + t.nbytes() <= h.file_size);
    if (const std::size_t es = hfdelta::dtype_size(t.dtype); es != 0) {
      std::uint64_t elems = 1;
      for (auto d : t.shape) FUZZ_CHECK(!__builtin_mul_overflow(elems, d, &elems));
      FUZZ_CHECK(elems == t.elements());
      std::uint64_t need = 0;
      FUZZ_CHECK(!__builtin_mul_overflow(elems, es, &need));
      FUZZ_CHECK(need == t.nbytes());
    }
    FUZZ_CHECK(h.find(t.name) == &t);
    pos = t.end;
  }
  FUZZ_CHECK(pos == buffer);

  // The writer re-encodes what the reader accepted into a header that the
  // reader accepts again with the same tensors (offsets, dtypes, shapes).
  const std::string prefix = hfdelta::encode_safetensors_header(h.tensors, h.has_metadata ? &h.metadata : nullptr);
  FUZZ_CHECK(prefix.size() % 8 == 0);
  const auto again = hfdelta::parse_safetensors(prefix, prefix.size() + buffer, "fuzz re-encoded");
  FUZZ_CHECK(again.tensors.size() == h.tensors.size());
  for (const auto& a : h.tensors) {
    // By name: empty tensors sharing an offset may come back in another order.
    const auto* b = again.find(a.name);
    FUZZ_CHECK(b != nullptr);
    FUZZ_CHECK(a.dtype == b->dtype && a.shape == b->shape && a.begin == b->begin && a.end == b->end);
  }
  FUZZ_CHECK(again.has_metadata == h.has_metadata);
  FUZZ_CHECK(again.metadata == h.metadata);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  hfdelta::SafetensorsHeader h;
  try {
    h = hfdelta::parse_safetensors(bytes, size, "fuzz");
  } catch (const hfdelta::Error& e) {
    FUZZ_CHECK(e.code() == hfdelta::Exit::bad_input);
    return 0;
  }
  check_accepted(h, bytes);
  return 0;
}
