// The input of the context target (fuzz_context.cpp) and the base it decodes
// against, shared with make_seeds.cpp, which writes seeds whose entries were
// encoded against that same base.
//
// Input, in order (missing bytes read as zero):
//   4 bytes, little-endian: the tensor size, folded into [0, kMaxContextTensor]
//     (as the sparse target: 1- and 2-byte elements reach a second and third
//     chunk of 2^20 elements);
//   1 byte: the base, kind = byte & 3, seed = byte >> 2:
//     0 zeros (one context whatever the field),
//     1 weight-like (odd bytes 0x3c..0x3e, even bytes noise: a few exponents
//       for BF16, F32, F64 and F8 fields),
//     2 noise (every context),
//     3 the next bytes of the input repeated: 1 byte, the tile's length - 1,
//       then the tile (cut short where the input ends; none: zeros);
//   the entry: everything after.
// The base is a function of the offset, so the target makes only the pieces
// the decoder asks for.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "codec/codec.hpp"
#include "fuzz_check.hpp"

namespace fuzz {

inline constexpr std::uint64_t kMaxContextTensor = 2 * hfdelta::kContextChunkElements + 16;

enum ContextBaseKind : std::uint8_t { base_zeros = 0, base_weights = 1, base_noise = 2, base_tile = 3 };

struct ContextInput {
  std::uint64_t nbytes = 0;
  std::uint8_t kind = base_zeros, seed = 0;
  std::span<const std::uint8_t> tile;
  std::span<const std::uint8_t> entry;
};

inline ContextInput context_input(const std::uint8_t* data, std::size_t size) {
  ContextInput in;
  in.nbytes = tensor_size(data, size, kMaxContextTensor);
  std::size_t at = std::min<std::size_t>(4, size);
  if (at < size) {
    in.kind = data[at] & 3;
    in.seed = static_cast<std::uint8_t>(data[at] >> 2);
    ++at;
  }
  if (in.kind == base_tile && at < size) {
    const std::size_t len = std::min<std::size_t>(std::size_t{data[at]} + 1, size - at - 1);
    ++at;
    in.tile = {data + at, len};
    at += len;
  }
  in.entry = {data + at, size - at};
  return in;
}

// splitmix64's finaliser: 8 bytes of noise per word index.
inline std::uint64_t context_noise(std::uint64_t seed, std::uint64_t word) {
  std::uint64_t z = word + (seed + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Base bytes [off, off + n) of the tensor `in` names.
inline void context_base(const ContextInput& in, std::uint64_t off, std::uint8_t* out, std::size_t n) {
  if (n == 0) return;
  if (in.kind == base_zeros || (in.kind == base_tile && in.tile.empty())) {
    std::memset(out, 0, n);
    return;
  }
  if (in.kind == base_tile) {
    const std::size_t len = in.tile.size();
    std::size_t t = static_cast<std::size_t>(off % len);
    for (std::size_t i = 0; i < n; ++i) {
      out[i] = in.tile[t];
      if (++t == len) t = 0;
    }
    return;
  }
  for (std::size_t i = 0; i < n;) {
    const std::uint64_t at = off + i;
    const std::uint64_t w = context_noise(in.seed, at / 8);
    for (unsigned b = static_cast<unsigned>(at % 8); b < 8 && i < n; ++b, ++i) {
      const auto x = static_cast<std::uint8_t>(w >> (8 * b));
      out[i] = in.kind == base_noise || (off + i) % 2 == 0 ? x : static_cast<std::uint8_t>(0x3c + x % 3);
    }
  }
}

inline std::vector<std::uint8_t> context_base(const ContextInput& in) {
  std::vector<std::uint8_t> b(static_cast<std::size_t>(in.nbytes));
  context_base(in, 0, b.data(), b.size());
  return b;
}

// The input that names `nbytes`, the base byte (kind | seed << 2), the tile
// (kind 3) and the entry: what make_seeds writes.
inline std::vector<std::uint8_t> context_input_bytes(std::uint32_t nbytes, std::uint8_t kind, std::uint8_t seed,
                                                     std::span<const std::uint8_t> tile,
                                                     std::span<const std::uint8_t> entry) {
  std::vector<std::uint8_t> out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(nbytes >> (8 * i)));
  out.push_back(static_cast<std::uint8_t>(kind | seed << 2));
  if (kind == base_tile) {
    out.push_back(static_cast<std::uint8_t>(tile.size() - 1));  // 1 to 256 bytes
    out.insert(out.end(), tile.begin(), tile.end());
  }
  out.insert(out.end(), entry.begin(), entry.end());
  return out;
}

}  // namespace fuzz
