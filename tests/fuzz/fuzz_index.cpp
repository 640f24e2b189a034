// Fuzz target: a delta's model.safetensors.index.json through the index reader.
//
// Refusing with hfdelta::Error (bad input or unsupported) is fine. An accepted
// index must only name safe relative paths, and must survive a round trip
// through the writer unchanged.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "delta/delta_format_internal.hpp"
#include "fuzz_check.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"

namespace {

bool safe_relative(const std::string& p) {
  if (p.empty() || p.front() == '/' || p.find('\0') != std::string::npos || p.find('\\') != std::string::npos)
    return false;
  std::size_t start = 0;
  for (;;) {
    const std::size_t slash = p.find('/', start);
    const std::string part = p.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

bool same(const hfdelta::DeltaIndex& a, const hfdelta::DeltaIndex& b) {
  if (a.version != b.version || a.base_version != b.base_version || a.encoding != b.encoding ||
      a.per_tensor != b.per_tensor || a.encodings != b.encodings || a.weight_map != b.weight_map ||
      a.base_checksums != b.base_checksums || a.files.size() != b.files.size())
    return false;
  for (std::size_t i = 0; i < a.files.size(); ++i) {
    const auto& x = a.files[i];
    const auto& y = b.files[i];
    if (x.path != y.path || x.op != y.op || x.size != y.size || !(x.hash == y.hash)) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  hfdelta::DeltaIndex d;
  try {
    d = hfdelta::parse_delta_index(text, "fuzz");
  } catch (const hfdelta::Error& e) {
    FUZZ_CHECK(e.code() == hfdelta::Exit::bad_input || e.code() == hfdelta::Exit::unsupported);
    return 0;
  }
  for (const auto& [tensor, file] : d.weight_map) {
    FUZZ_CHECK(safe_relative(file));
    FUZZ_CHECK(file.find('/') == std::string::npos);
    // Every tensor of the delta has an encoding an applier can look up.
    if (d.per_tensor) FUZZ_CHECK(d.encodings.count(tensor) == 1);
    (void)hfdelta::encoding_of(d, tensor);
  }
  if (!d.per_tensor) FUZZ_CHECK(d.encodings.empty());
  std::set<std::string> paths;
  for (const auto& f : d.files) {
    FUZZ_CHECK(safe_relative(f.path));
    FUZZ_CHECK(paths.insert(f.path).second);
    if (f.op == hfdelta::FileChange::Op::remove) FUZZ_CHECK(f.size == 0 && f.hash == hfdelta::Hash128{});
  }

  const std::string again_text = hfdelta::write_delta_index_json(d, 0);
  const hfdelta::DeltaIndex again = hfdelta::parse_delta_index(again_text, "fuzz re-written");
  FUZZ_CHECK(same(d, again));
  return 0;
}
