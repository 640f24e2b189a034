// A parts entry (format revision 6) laid as delta-apply lays it, for the
// parts and stack targets: over a tensor of known bytes (parts_tensor, which
// make_seeds.cpp shares, so its valid seeds end at their parts' checksums),
// each region gathered row-major, decoded by its part's own decoder, checked
// against the part's checksum and scattered back. A refusal throws
// hfdelta::Error; anything a refusal may not be (a change outside its
// region, a region outside the tensor) breaks an invariant.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/codec.hpp"
#include "delta/parts.hpp"
#include "fuzz_check.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/hash.hpp"

namespace fuzz {

// The tensor a parts entry is laid over: `n` bytes that look a little like
// bf16 weights (a context part's groups then see several exponents).
inline std::vector<std::uint8_t> parts_tensor(std::uint64_t n) {
  std::vector<std::uint8_t> t(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::uint8_t>(i % 2 ? 0x3c + (i / 2) % 3 : (i * 131 + 7) & 0xff);
  return t;
}

// One part decoded over `region` (its bytes, row-major), in place.
inline void lay_part(const hfdelta::PartRecord& p, std::vector<std::uint8_t>& region) {
  const std::uint64_t n = region.size();
  const hfdelta::SparsePatch add = [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> v,
                                       std::size_t es, hfdelta::SparseOp op) {
    FUZZ_CHECK(v.size() == offs.size() * es);
    for (std::size_t i = 0; i < offs.size(); ++i) {
      FUZZ_CHECK(offs[i] < n && es <= n - offs[i]);
      hfdelta::sparse_apply_value(region.data() + offs[i], v.data() + i * es, es, op);
    }
  };
  hfdelta::Decompressor d;
  switch (p.enc) {
    case hfdelta::Encoding::xor_bytes:
      hfdelta::decode_xor(d, p.bytes, n, "fuzz", [&](std::uint64_t off, std::span<const std::uint8_t> x) {
        FUZZ_CHECK(off <= n && x.size() <= n - off);
        for (std::size_t i = 0; i < x.size(); ++i) region[off + i] ^= x[i];
      });
      break;
    case hfdelta::Encoding::sparse:
      hfdelta::decode_sparse(p.bytes, n, "fuzz", add);
      break;
    case hfdelta::Encoding::context:
      hfdelta::decode_context(
          p.bytes, n, "fuzz",
          [&](std::uint64_t off, std::size_t k) {
            FUZZ_CHECK(off <= n && k <= n - off);
            return std::span<const std::uint8_t>(region).subspan(off, k);
          },
          add);
      break;
    default:
      FUZZ_CHECK(false);  // read_parts hands out xor, sparse and context parts only
  }
}

// Every part of `pe` laid over `tensor` (pe.m.bytes() of them).
inline void lay_parts(const hfdelta::PartsEntry& pe, std::vector<std::uint8_t>& tensor) {
  FUZZ_CHECK(pe.m.bytes() == tensor.size());
  for (const hfdelta::PartRecord& p : pe.parts) {
    const hfdelta::Region& g = p.region;
    FUZZ_CHECK(g.rows && g.cols && g.row0 + g.rows <= pe.m.rows && g.col0 + g.cols <= pe.m.cols);
    const std::uint64_t row = g.cols * pe.m.es;
    std::vector<std::uint8_t> region(static_cast<std::size_t>(g.rows * row));
    const auto at = [&](std::uint64_t r) { return ((g.row0 + r) * pe.m.cols + g.col0) * pe.m.es; };
    for (std::uint64_t r = 0; r < g.rows; ++r)
      std::copy_n(tensor.begin() + static_cast<std::ptrdiff_t>(at(r)), row,
                  region.begin() + static_cast<std::ptrdiff_t>(r * row));
    lay_part(p, region);
    if (hfdelta::xxh3_128(region) != p.hash)
      hfdelta::fail(hfdelta::Exit::verify_failed, "fuzz: a part's region does not end at its checksum");
    for (std::uint64_t r = 0; r < g.rows; ++r)
      std::copy_n(region.begin() + static_cast<std::ptrdiff_t>(r * row), row,
                  tensor.begin() + static_cast<std::ptrdiff_t>(at(r)));
  }
}

}  // namespace fuzz
