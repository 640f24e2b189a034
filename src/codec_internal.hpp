// Codec internals shared by the library's sources only (codec.hpp is the API):
// reading zstd frames piece by piece, the sparse entry's head and chunks, and
// the per-element step of applying sparse values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "hfdelta/codec.hpp"

namespace hfdelta {

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

}  // namespace hfdelta
