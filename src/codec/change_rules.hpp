// What the chunked encodings (sparse, context) take from an element, written
// once for the CPU encoders and the CUDA kernels of cuda/: what a change is,
// its difference and zigzag value, the bytes it changes, its base context,
// its context group, the chunk it lies in and the context encoder's sample.
// Plain integer code: g++ builds it without the CUDA Toolkit, nvcc for both
// sides (HFDELTA_HD).
#pragma once

#include <cstddef>
#include <cstdint>

#include "codec/codec.hpp"

#if defined(__CUDACC__)
#define HFDELTA_HD __host__ __device__
#else
#define HFDELTA_HD
#endif

namespace hfdelta::rules {

// All ones in an element of `es` bytes.
HFDELTA_HD constexpr std::uint64_t element_ones(std::size_t es) {
  return es >= 8 ? ~0ull : (std::uint64_t{1} << (8 * es)) - 1;
}

// An element of `es` bytes at `p`, little-endian.
HFDELTA_HD inline std::uint64_t load_element(const std::uint8_t* p, std::size_t es) {
  std::uint64_t v = 0;
  for (std::size_t k = 0; k < es; ++k) v |= std::uint64_t{p[k]} << (8 * k);
  return v;
}

// An element changed where any of its bytes did: where its value did.
HFDELTA_HD constexpr bool changed(std::uint64_t old_v, std::uint64_t new_v) { return old_v != new_v; }

// How many of an element's `es` bytes differ.
HFDELTA_HD constexpr unsigned changed_bytes(std::uint64_t old_v, std::uint64_t new_v, std::size_t es) {
  const std::uint64_t x = old_v ^ new_v;
  unsigned n = 0;
  for (std::size_t k = 0; k < es; ++k) n += ((x >> (8 * k)) & 0xff) != 0;
  return n;
}

// The difference new - old as little-endian unsigned integers, modulo 2^(8 es).
HFDELTA_HD constexpr std::uint64_t difference(std::uint64_t old_v, std::uint64_t new_v, std::size_t es) {
  return (new_v - old_v) & element_ones(es);
}

// A difference added back: old + d, modulo 2^(8 es) (the base brought
// forward to the new bytes, as an entry's apply does).
HFDELTA_HD constexpr std::uint64_t applied(std::uint64_t old_v, std::uint64_t d, std::size_t es) {
  return (old_v + d) & element_ones(es);
}

// An element of `es` bytes stored at `p`, little-endian.
HFDELTA_HD inline void store_element(std::uint8_t* p, std::uint64_t v, std::size_t es) {
  for (std::size_t k = 0; k < es; ++k) p[k] = static_cast<std::uint8_t>(v >> (8 * k));
}

// A difference as sparse's values carry it (SparseOp::add_zigzag): its sign
// in the low bit, so that small steps either way are small numbers.
HFDELTA_HD constexpr std::uint64_t zigzag(std::uint64_t d, std::size_t es) {
  return ((d << 1) ^ (0 - (d >> (8 * es - 1)))) & element_ones(es);
}

// A difference as context's value streams carry it: its magnitude less one,
// and its sign (`ones` = element_ones(es)).
struct SignedValue {
  std::uint64_t mag_minus1;
  std::uint64_t neg;  // 0 or 1
};
HFDELTA_HD constexpr SignedValue signed_value(std::uint64_t d, std::uint64_t ones) {
  const std::uint64_t neg = d > (ones >> 1);
  return {(neg ? (0 - d) & ones : d) - 1, neg};
}

// A base element's context: its field's bits (none: context 0, whatever the shift).
HFDELTA_HD constexpr std::uint8_t context_of(std::uint64_t base_v, ContextField f) {
  return f.bits ? static_cast<std::uint8_t>((base_v >> f.shift) & ((std::uint64_t{1} << f.bits) - 1)) : 0;
}

// The group of context `c` in a chunk whose groups start at contexts lo[0]
// (= 0) < lo[1] < ... < lo[G-1]: how many of the later starts it reaches.
HFDELTA_HD constexpr unsigned group_of(std::uint8_t c, const std::uint8_t* lo, unsigned G) {
  unsigned g = 0;
  while (g + 1 < G && c >= lo[g + 1]) ++g;
  return g;
}

// The element size the chunked encodings use for a dtype of `es` bytes:
// sizes other than 1, 2, 4 and 8, or not dividing the tensor, fall back to 1.
HFDELTA_HD constexpr std::size_t chunked_elem_size(std::size_t es, std::uint64_t nbytes) {
  return (es == 1 || es == 2 || es == 4 || es == 8) && nbytes % es == 0 ? es : 1;
}

// Chunks of kSparseChunkElements elements over `n` elements.
HFDELTA_HD constexpr std::uint64_t chunk_count(std::uint64_t n) {
  return n == 0 ? 0 : (n - 1) / kSparseChunkElements + 1;
}
HFDELTA_HD constexpr std::uint64_t chunk_of(std::uint64_t e) { return e / kSparseChunkElements; }
HFDELTA_HD constexpr std::uint32_t index_in_chunk(std::uint64_t e) {
  return static_cast<std::uint32_t>(e % kSparseChunkElements);
}

// The context encoder's estimate of how many base elements each context has
// (it steers the groups only): the first kSampleRun elements of every
// kSampleEvery of a chunk, each counting kSampleWeight.
inline constexpr std::uint64_t kSampleEvery = 1024, kSampleRun = 64, kSampleWeight = kSampleEvery / kSampleRun;
HFDELTA_HD constexpr bool sampled(std::uint64_t index_in_chunk) { return index_in_chunk % kSampleEvery < kSampleRun; }

static_assert(kSparseChunkElements % kSampleEvery == 0, "a chunk's sample starts at its first element");
static_assert(kSparseChunkElements % 64 == 0, "a 64-element mask word never straddles two chunks");

}  // namespace hfdelta::rules
