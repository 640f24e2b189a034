// Fuzz target: a parts entry ("HFR1", format revision 6) on untrusted bytes.
//
// Input: 4 bytes, little-endian, giving the tensor size (folded to at most
// 1 MiB), a flags byte, then the entry. The checksum the delta records for a
// parts entry is that of its head, so the target gives read_parts the
// checksum of the entry's own head (flags bit 0: that checksum with a bit
// flipped, which must be refused), letting every other rule be reached.
// read_parts must accept exactly the entries a second, independent reading
// of the layout accepts (docs/format.md, "parts"), and hand out the same
// parts, each a view inside the entry. An accepted entry whose matrix is not
// the tensor's is refused by delta-apply's plan; the others are laid as
// delta-apply lays them (parts_lay.hpp): any refusal must be
// Error(bad_input) or, for a region that does not end at its part's checksum
// or a context part on another base, Error(verify_failed).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "delta/parts.hpp"
#include "fuzz_check.hpp"
#include "hfdelta/error.hpp"
#include "parts_lay.hpp"

namespace {

using fuzz::le;

struct RefPart {
  std::uint64_t row0 = 0, rows = 0, col0 = 0, cols = 0, code = 0, offset = 0, size = 0, high = 0, low = 0;
};

// The reference reading. Layout, little-endian:
//   "HFR1" | u32 P (1..65536) | u64 R | u64 W | u64 es (1, 2, 4, 8; R*W*es without overflow)
//   | P x (u64 row0 | u64 rows | u64 col0 | u64 cols | u32 encoding 0, 2, 3 | u32 0 | u64 length
//          | u64 hash high | u64 hash low)
//   | the parts' bytes, exactly filling the entry.
// Regions: at least one row and one column, inside the R x W matrix, listed by
// (row0, col0) strictly ascending, none overlapping an earlier one. The head's
// checksum is the one given (`head_ok`).
bool reference(std::span<const std::uint8_t> e, bool head_ok, std::vector<RefPart>& out) {
  if (e.size() < 32 || std::memcmp(e.data(), "HFR1", 4) != 0) return false;
  const std::uint64_t n = le(e.data() + 4, 4), rows = le(e.data() + 8, 8), cols = le(e.data() + 16, 8),
                      es = le(e.data() + 24, 8);
  if (n == 0 || n > 65536) return false;
  if (es != 1 && es != 2 && es != 4 && es != 8) return false;
  std::uint64_t total = 0;
  if (__builtin_mul_overflow(rows, cols, &total) || __builtin_mul_overflow(total, es, &total)) return false;
  if (e.size() < 32 + 64 * n || !head_ok) return false;
  std::uint64_t at = 32 + 64 * n;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint8_t* r = e.data() + 32 + 64 * i;
    RefPart p{le(r, 8), le(r + 8, 8),  le(r + 16, 8), le(r + 24, 8), le(r + 32, 4),
              0,        le(r + 40, 8), le(r + 48, 8), le(r + 56, 8)};
    std::uint64_t end_r = 0, end_c = 0;
    if (__builtin_add_overflow(p.row0, p.rows, &end_r) || __builtin_add_overflow(p.col0, p.cols, &end_c)) return false;
    if (!p.rows || !p.cols || end_r > rows || end_c > cols) return false;
    if ((p.code != 0 && p.code != 2 && p.code != 3) || le(r + 36, 4) != 0) return false;
    if (p.size > e.size() - at) return false;
    p.offset = at;
    at += p.size;
    if (!out.empty() && (p.row0 < out.back().row0 || (p.row0 == out.back().row0 && p.col0 <= out.back().col0)))
      return false;
    for (const RefPart& q : out)
      if (p.row0 < q.row0 + q.rows && q.row0 < p.row0 + p.rows && p.col0 < q.col0 + q.cols && q.col0 < p.col0 + p.cols)
        return false;
    out.push_back(p);
  }
  return at == e.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::uint64_t nbytes = fuzz::tensor_size(data, size);
  const bool wrong = size >= 5 && (data[4] & 1);
  const std::span<const std::uint8_t> entry =
      size >= 5 ? std::span(data + 5, size - 5) : std::span<const std::uint8_t>();

  // The checksum of the head as far as the entry holds one (what a delta
  // records for it), or that with a bit flipped.
  const std::uint64_t count = entry.size() >= 8 ? le(entry.data() + 4, 4) : 0;
  const std::size_t head = static_cast<std::size_t>(
      std::min<std::uint64_t>(entry.size(), hfdelta::kPartsHeadSize + hfdelta::kPartsRecordSize * count));
  hfdelta::Hash128 checksum = hfdelta::parts_checksum(entry.first(head));
  if (wrong) checksum.low ^= 1;

  hfdelta::PartsEntry pe;
  bool ok = true;
  try {
    pe = hfdelta::read_parts(entry, checksum, "fuzz");
  } catch (const hfdelta::Error& e) {
    FUZZ_CHECK(e.code() == hfdelta::Exit::bad_input);
    ok = false;
  }
  std::vector<RefPart> want;
  FUZZ_CHECK(ok == reference(entry, !wrong, want));
  if (!ok) return 0;
  FUZZ_CHECK(pe.parts.size() == want.size());
  FUZZ_CHECK(pe.head_size() == hfdelta::kPartsHeadSize + hfdelta::kPartsRecordSize * want.size());
  FUZZ_CHECK(pe.m.rows == le(entry.data() + 8, 8) && pe.m.cols == le(entry.data() + 16, 8) &&
             pe.m.es == le(entry.data() + 24, 8));
  const hfdelta::Encoding enc[] = {hfdelta::Encoding::xor_bytes, hfdelta::Encoding::overwrite,
                                   hfdelta::Encoding::sparse, hfdelta::Encoding::context};
  for (std::size_t i = 0; i < want.size(); ++i) {
    const hfdelta::PartRecord& p = pe.parts[i];
    FUZZ_CHECK(p.region == (hfdelta::Region{want[i].row0, want[i].rows, want[i].col0, want[i].cols}));
    FUZZ_CHECK(p.enc == enc[want[i].code]);
    FUZZ_CHECK(p.size == want[i].size && p.bytes.size() == p.size);
    FUZZ_CHECK(p.bytes.data() == entry.data() + want[i].offset);
    FUZZ_CHECK(p.hash.high == want[i].high && p.hash.low == want[i].low);
  }

  // delta-apply's plan refuses a matrix that is not the tensor's; the rest
  // is laid part by part.
  if (pe.m.bytes() != nbytes) return 0;
  std::vector<std::uint8_t> tensor = fuzz::parts_tensor(nbytes);
  try {
    fuzz::lay_parts(pe, tensor);
  } catch (const hfdelta::Error& e) {
    FUZZ_CHECK(e.code() == hfdelta::Exit::bad_input || e.code() == hfdelta::Exit::verify_failed);
  }
  return 0;
}
