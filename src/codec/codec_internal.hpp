// Codec internals shared by the library's sources only (codec.hpp is the API):
// reading zstd frames piece by piece, the sparse entry's head and chunks, and
// the per-element step of applying sparse values.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "codec/change_rules.hpp"
#include "codec/codec.hpp"

namespace hfdelta {

// Little-endian fields of entry heads.
inline void put_le32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline std::uint32_t get_le32(const std::uint8_t* p) {
  return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24;
}
inline void put_le64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline std::uint64_t get_le64(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);  // one load (the loop over bytes is not merged into one)
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

// Throws Error(bad_input) naming `what` unless `frame` starts a zstd frame
// whose declared content size (if any) is `expect`.
void check_declared_size(std::span<const std::uint8_t> frame, std::uint64_t expect, const std::string& what);

// Bit i of out[k] set where byte i of 64-byte block k of `a` and `b` differ
// (the widest byte comparison the CPU has).
void diff_masks(const std::uint8_t* a, const std::uint8_t* b, std::size_t blocks, std::uint64_t* out);

// From a mask of differing bytes, the lowest bit of each ES-byte element
// that has any.
template <std::size_t ES>
inline std::uint64_t element_mask(std::uint64_t m) {
  if constexpr (ES >= 2) m |= m >> 1;
  if constexpr (ES >= 4) m |= m >> 2;
  if constexpr (ES >= 8) m |= m >> 4;
  constexpr std::uint64_t lanes = ES == 1   ? ~0ull
                                  : ES == 2 ? 0x5555555555555555ull
                                  : ES == 4 ? 0x1111111111111111ull
                                            : 0x0101010101010101ull;
  return m & lanes;
}

// Calls f(off) with the byte offset of every element of `n` (of ES bytes)
// that differs between `a` and `b`, ascending: the masks of a batch of 64-byte
// blocks first (vectorised, branch-free), then the changed elements of the
// blocks that have any.
template <std::size_t ES, class F>
inline void for_each_change(const std::uint8_t* a, const std::uint8_t* b, std::size_t n, F&& f) {
  constexpr std::size_t kBatch = 1024;
  std::uint64_t masks[kBatch];
  const std::size_t len = n * ES, blocks = len / 64;
  for (std::size_t b0 = 0; b0 < blocks; b0 += kBatch) {
    const std::size_t nb = std::min(kBatch, blocks - b0);
    diff_masks(a + 64 * b0, b + 64 * b0, nb, masks);
    for (std::size_t k = 0; k < nb; ++k)
      for (std::uint64_t m = element_mask<ES>(masks[k]); m; m &= m - 1)
        f(64 * (b0 + k) + static_cast<std::size_t>(std::countr_zero(m)));
  }
  for (std::size_t off = 64 * blocks; off < len; off += ES)
    if (std::memcmp(a + off, b + off, ES) != 0) f(off);
}

// Pulls decoded bytes out of one untrusted zstd frame, a bounded buffer at a
// time, and insists that the input is exactly one complete frame. Errors are
// Error(bad_input) naming `what`.
class FrameReader {
 public:
  FrameReader(Decompressor& d, std::span<const std::uint8_t> frame, const std::string& what);
  void read(void* dst, std::size_t n);  // exactly n bytes, or throws
  void skip(std::uint64_t n);
  std::span<const std::uint8_t> next();  // next decoded piece; empty at the end of the frame
  void expect_end();                     // throws unless the frame ends exactly here
  [[noreturn]] void bad(const std::string& msg) const;

 private:
  std::size_t avail() const { return len_ - pos_; }
  bool refill();

  ZSTD_DCtx_s* dctx_;
  std::string what_;
  const void* in_data_ = nullptr;
  std::size_t in_size_ = 0, in_pos_ = 0;
  std::span<std::uint8_t> buf_;
  std::size_t pos_ = 0, len_ = 0;
  bool ended_ = false;
};

// An entry (or a decoded stream) read front to back; every read is checked
// against its end. Errors are Error(bad_input): "<what>: <kind> <rule>".
struct EntryCursor {
  std::span<const std::uint8_t> entry;
  const std::string& what;
  const char* kind;  // "sparse entry", "context entry"
  std::uint64_t at = 0;

  [[noreturn]] void bad(const std::string& msg) const;
  const std::uint8_t* take(std::uint64_t k);
  std::uint8_t byte() { return *take(1); }
  std::uint64_t varint();  // LEB128, at most 64 bits
};

// How many chunks of kSparseChunkElements elements of `sparse_es` bytes a
// sparse entry of a tensor of `nbytes` bytes has.
std::uint64_t sparse_chunk_count(std::uint64_t nbytes, std::size_t sparse_es);

// The head of a sparse entry, read but not yet checked against a tensor.
struct SparseHead {
  SparseOp op = SparseOp::add_zigzag;  // "HFS2"; "HFS1" entries hold XOR values
  std::uint32_t es = 0;
  std::uint64_t nbytes = 0, chunk_elements = 0, chunks = 0;
};
// Throws Error(bad_input) naming `what` if `entry` is shorter than a head or
// starts with neither magic.
SparseHead read_sparse_head(std::span<const std::uint8_t> entry, const std::string& what);

// sparse_apply_value for an element size known at compile time.
template <std::size_t ES>
inline void sparse_apply_value_t(std::uint8_t* elem, const std::uint8_t* v, SparseOp op) {
  std::uint64_t x = 0, zz = 0;
  std::memcpy(&x, elem, ES);
  std::memcpy(&zz, v, ES);
  // Little-endian: the low ES bytes, modulo 2^(8*ES).
  x = op == SparseOp::xor_bytes ? x ^ zz : x + ((zz >> 1) ^ (0 - (zz & 1)));
  std::memcpy(elem, &x, ES);
}

// decode_sparse of only chunks [first, last) (chunks decode independently, so
// callers can share one entry's chunks out between threads). The entry's head
// and chunk table are checked whatever the range; the bytes after the last
// chunk are checked by the call whose range reaches it.
void decode_sparse_chunks(std::span<const std::uint8_t> entry, std::uint64_t nbytes, std::uint64_t first,
                          std::uint64_t last, const std::string& what, const SparsePatch& patch);

// decode_context of only chunks [first, last) (as decode_sparse_chunks): the
// base view is asked only for those chunks' bytes.
void decode_context_chunks(std::span<const std::uint8_t> entry, std::uint64_t nbytes, std::uint64_t first,
                           std::uint64_t last, const std::string& what, const BaseView& base, const SparsePatch& patch);

// Which build of the context codec's loops over every element runs: 0 the
// baseline, 1 x86-64-v3 (AVX2, BMI2), 2 AVX-512BW; the widest the CPU has.
// `cap` >= 0 lowers it (never above the CPU's) so that tests can run every
// build on one machine; not for use while a tensor is being coded.
int context_isa_level(int cap = -1);

// Whether the context decoder walks a chunk's base an element at a time, as
// the format describes it, instead of in blocks: what the tests compare the
// walks of every build against. `on` >= 0 sets it; returns the setting.
bool context_reference_walk(int on = -1);

}  // namespace hfdelta
