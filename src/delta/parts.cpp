#include "delta/parts.hpp"

#include <cstring>

#include "hfdelta/error.hpp"

namespace hfdelta {

namespace {

void put64(std::vector<std::uint8_t>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
std::uint64_t get64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint32_t get32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
// The record code of a part's encoding: xor, sparse or context.
std::uint32_t part_code(Encoding e) {
  if (!encoding_info(e).in_parts) fail(Exit::failure, "parts_head: a part is xor, sparse or context");
  return code_of(e, "parts_head");
}

// a * b, or nothing where it overflows.
bool mul_ok(std::uint64_t a, std::uint64_t b, std::uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

}  // namespace

MatrixShape matrix_shape(std::span<const std::uint64_t> shape, std::size_t dtype_size) {
  MatrixShape m;
  m.es = dtype_size ? dtype_size : 1;
  if (shape.empty()) return m;
  m.rows = shape[0];
  for (std::size_t i = 1; i < shape.size(); ++i) m.cols *= shape[i];
  return m;
}

std::vector<std::uint8_t> parts_head(const MatrixShape& m, const std::vector<PartRecord>& parts) {
  std::vector<std::uint8_t> out;
  out.reserve(kPartsHeadSize + kPartsRecordSize * parts.size());
  for (const char c : encoding_info(Encoding::parts).magic) out.push_back(static_cast<std::uint8_t>(c));
  put32(out, static_cast<std::uint32_t>(parts.size()));
  put64(out, m.rows), put64(out, m.cols), put64(out, m.es);
  for (const PartRecord& p : parts) {
    put64(out, p.region.row0), put64(out, p.region.rows), put64(out, p.region.col0), put64(out, p.region.cols);
    put32(out, part_code(p.enc)), put32(out, 0);
    put64(out, p.size);
    put64(out, p.hash.high), put64(out, p.hash.low);
  }
  return out;
}

Hash128 parts_checksum(std::span<const std::uint8_t> entry_head) {
  Hasher h;
  h.update(entry_head);
  return h.digest();
}

PartsEntry read_parts(std::span<const std::uint8_t> entry, const Hash128& checksum, const std::string& what) {
  const auto bad = [&](const std::string& why) { fail(Exit::bad_input, what + ": parts entry " + why); };
  if (entry.size() < kPartsHeadSize || std::memcmp(entry.data(), encoding_info(Encoding::parts).magic.data(), 4) != 0)
    bad("does not start with HFR1");
  const std::uint32_t n = get32(entry.data() + 4);
  if (n == 0 || n > kPartsMax) bad("declares " + std::to_string(n) + " parts (1 to " + std::to_string(kPartsMax) + ")");
  PartsEntry pe;
  pe.m.rows = get64(entry.data() + 8), pe.m.cols = get64(entry.data() + 16), pe.m.es = get64(entry.data() + 24);
  std::uint64_t total = 0;
  if (pe.m.es != 1 && pe.m.es != 2 && pe.m.es != 4 && pe.m.es != 8) bad("has element size " + std::to_string(pe.m.es));
  if (!mul_ok(pe.m.rows, pe.m.cols, total) || !mul_ok(total, pe.m.es, total)) bad("declares a matrix too large");
  const std::size_t head = kPartsHeadSize + kPartsRecordSize * n;
  if (entry.size() < head) bad("is shorter than its " + std::to_string(n) + " part records");
  if (parts_checksum(entry.first(head)) != checksum)
    bad("head does not match the checksum the delta records (" + checksum.hex() + ")");
  std::uint64_t at = head;
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::uint8_t* r = entry.data() + kPartsHeadSize + kPartsRecordSize * i;
    PartRecord p;
    p.region = {get64(r), get64(r + 8), get64(r + 16), get64(r + 24)};
    const std::string pw = "part " + std::to_string(i);
    const Region& g = p.region;
    if (!g.rows || !g.cols || g.row0 > pe.m.rows || g.rows > pe.m.rows - g.row0 || g.col0 > pe.m.cols ||
        g.cols > pe.m.cols - g.col0)
      bad(pw + " is not a region inside the " + std::to_string(pe.m.rows) + " x " + std::to_string(pe.m.cols) +
          " matrix");
    const std::uint32_t code = get32(r + 32);
    const std::optional<Encoding> enc = encoding_of_code(code);
    if (!enc || !encoding_info(*enc).in_parts || get32(r + 36) != 0)
      bad(pw + " has unknown encoding " + std::to_string(code));
    p.enc = *enc;
    p.size = get64(r + 40);
    p.hash = {get64(r + 48), get64(r + 56)};
    if (p.size > entry.size() - at) bad(pw + " runs past the entry's end");
    p.bytes = entry.subspan(at, p.size);
    at += p.size;
    if (!pe.parts.empty()) {
      const Region& q = pe.parts.back().region;
      if (g.row0 < q.row0 || (g.row0 == q.row0 && g.col0 <= q.col0)) bad(pw + " is not after the part before it");
    }
    for (const PartRecord& o : pe.parts)
      if (o.region.overlaps(g)) bad(pw + " overlaps an earlier part");
    pe.parts.push_back(p);
  }
  if (at != entry.size()) bad("has " + std::to_string(entry.size() - at) + " bytes after its last part");
  return pe;
}

}  // namespace hfdelta
