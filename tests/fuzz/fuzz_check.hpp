// Invariant checks shared by the fuzz targets: a broken invariant prints what
// broke and aborts, which libFuzzer reports as a crash with the input saved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

// Every target defines this; libFuzzer (scripts/ci/fuzz.sh) or replay_main.cpp
// (meson test) calls it.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

#define FUZZ_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

namespace fuzz {

// Tensor size chosen by a fuzz input: its first four bytes, little-endian,
// folded into [0, max] so a decoder never gets a tensor over 1 MiB (or
// `max`: the sparse target needs a little more to reach a second chunk).
inline constexpr std::uint64_t kMaxTensor = 1u << 20;

inline std::uint64_t tensor_size(const std::uint8_t* data, std::size_t size, std::uint64_t max = kMaxTensor) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4 && i < size; ++i) v |= std::uint32_t(data[i]) << (8 * i);
  return v <= max ? v : v % (max + 1);
}

// The checksum the stack target tells read_stack the tensor ends at (a delta
// records it beside the entry): the seeds' last parts carry it.
inline constexpr std::uint64_t kStackHashHigh = 0x66757a7a2d737461ull, kStackHashLow = 0x636b2d656e642121ull;

// `bytes` bytes at `p` read as a little-endian number (the reference
// readings' own reader, independent of the library's).
inline std::uint64_t le(const std::uint8_t* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace fuzz
