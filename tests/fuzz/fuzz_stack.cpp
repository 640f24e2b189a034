// Fuzz target: a stacked entry ("HFK1") on untrusted bytes.
//
// Input: 4 bytes, little-endian, giving the tensor size (folded to at most
// 1 MiB), then the entry, which must end at the checksum fuzz::kStackHash*.
// read_stack must accept exactly the entries a second, independent reading
// of the layout accepts (see read_stack in src/codec.cpp), and hand out the
// same parts, each a view inside the entry.
// Each part of an accepted entry is then decoded by its own decoder, as
// delta-apply lays it: any refusal must be Error(bad_input), and every change
// must fall inside the tensor. A context part, which decodes only against the
// tensor's bytes before it, is checked by check_context (the context target
// decodes such entries against a base). A parts layer (revision 6) is read by
// read_parts against the checksum its record gives (its head's), then, where
// its matrix is the tensor's, laid as the parts target lays it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "codec/codec.hpp"
#include "delta/parts.hpp"
#include "fuzz_check.hpp"
#include "hfdelta/error.hpp"
#include "parts_lay.hpp"

namespace {

using fuzz::le;

struct RefPart {
  std::uint64_t code = 0;
  std::uint64_t offset = 0, size = 0, high = 0, low = 0;
};

// The reference reading. Layout, little-endian:
//   "HFK1" | u32 N (>= 1) | N x (u32 encoding 0..4 | u32 0 | u64 length | u64 hash high | u64 hash low)
//   | the N parts' bytes, exactly filling the entry; the last part's hash is the expected one
bool reference(std::span<const std::uint8_t> e, std::vector<RefPart>& out) {
  if (e.size() < 8 || std::memcmp(e.data(), "HFK1", 4) != 0) return false;
  const std::uint64_t n = le(e.data() + 4, 4);
  if (n == 0 || 8 + 32 * n > e.size()) return false;
  std::uint64_t at = 8 + 32 * n;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint8_t* r = e.data() + 8 + 32 * i;
    RefPart p;
    p.code = le(r, 4);
    if (p.code > 4 || le(r + 4, 4) != 0) return false;
    p.size = le(r + 8, 8);
    p.high = le(r + 16, 8);
    p.low = le(r + 24, 8);
    if (p.size > e.size() - at) return false;
    p.offset = at;
    at += p.size;
    out.push_back(p);
  }
  return at == e.size() && out.back().high == fuzz::kStackHashHigh && out.back().low == fuzz::kStackHashLow;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::uint64_t nbytes = fuzz::tensor_size(data, size);
  const std::span<const std::uint8_t> entry =
      size >= 4 ? std::span(data + 4, size - 4) : std::span<const std::uint8_t>();

  std::vector<hfdelta::StackLayer> parts;
  bool ok = true;
  try {
    parts = hfdelta::read_stack(entry, hfdelta::Hash128{fuzz::kStackHashHigh, fuzz::kStackHashLow}, "fuzz");
  } catch (const hfdelta::Error& e) {
    FUZZ_CHECK(e.code() == hfdelta::Exit::bad_input);
    ok = false;
  }
  std::vector<RefPart> want;
  FUZZ_CHECK(ok == reference(entry, want));
  if (!ok) return 0;
  FUZZ_CHECK(parts.size() == want.size());
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const hfdelta::StackLayer& p = parts[i];
    const hfdelta::Encoding enc[] = {hfdelta::Encoding::xor_bytes, hfdelta::Encoding::overwrite,
                                     hfdelta::Encoding::sparse, hfdelta::Encoding::context, hfdelta::Encoding::parts};
    FUZZ_CHECK(p.enc == enc[want[i].code]);
    FUZZ_CHECK(p.size == want[i].size && p.bytes.size() == p.size);
    FUZZ_CHECK(p.bytes.data() == entry.data() + want[i].offset);
    FUZZ_CHECK(p.hash.high == want[i].high && p.hash.low == want[i].low);
  }

  // Each part as delta-apply decodes it, on the same tensor.
  for (const hfdelta::StackLayer& p : parts) {
    try {
      hfdelta::Decompressor d1, d2;
      switch (p.enc) {
        case hfdelta::Encoding::xor_bytes:
          hfdelta::decode_xor(d1, p.bytes, nbytes, "fuzz", [&](std::uint64_t off, std::span<const std::uint8_t> x) {
            FUZZ_CHECK(off <= nbytes && x.size() <= nbytes - off);
          });
          break;
        case hfdelta::Encoding::overwrite:
          hfdelta::decode_overwrite(d1, d2, p.bytes, nbytes, "fuzz",
                                    [&](std::span<const std::uint64_t> pos, std::span<const std::uint8_t> v) {
                                      FUZZ_CHECK(pos.size() == v.size());
                                      for (const std::uint64_t q : pos) FUZZ_CHECK(q < nbytes);
                                    });
          break;
        case hfdelta::Encoding::sparse:
          hfdelta::decode_sparse(p.bytes, nbytes, "fuzz",
                                 [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> v,
                                     std::size_t es, hfdelta::SparseOp) {
                                   FUZZ_CHECK(v.size() == offs.size() * es);
                                   for (const std::uint64_t o : offs) FUZZ_CHECK(o < nbytes && es <= nbytes - o);
                                 });
          break;
        case hfdelta::Encoding::context: {
          const hfdelta::ContextSummary sum = hfdelta::check_context(p.bytes, nbytes, "fuzz");
          FUZZ_CHECK(sum.elem_size == 1 || sum.elem_size == 2 || sum.elem_size == 4 || sum.elem_size == 8);
          FUZZ_CHECK(sum.changes <= nbytes / sum.elem_size);
          break;
        }
        case hfdelta::Encoding::parts: {
          const hfdelta::PartsEntry pe = hfdelta::read_parts(p.bytes, p.hash, "fuzz");
          if (pe.m.bytes() != nbytes) break;  // delta-apply's plan refuses it
          std::vector<std::uint8_t> tensor = fuzz::parts_tensor(nbytes);
          try {
            fuzz::lay_parts(pe, tensor);
          } catch (const hfdelta::Error& e) {
            FUZZ_CHECK(e.code() == hfdelta::Exit::bad_input || e.code() == hfdelta::Exit::verify_failed);
          }
          break;
        }
        case hfdelta::Encoding::stack:
          FUZZ_CHECK(false);  // read_stack never hands one out
      }
    } catch (const hfdelta::Error& e) {
      FUZZ_CHECK(e.code() == hfdelta::Exit::bad_input);
    }
  }
  return 0;
}
