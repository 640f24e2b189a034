// The CUDA path's output computed on the CPU, element by element from the
// rules both share: what ChangeFinder must hand out. The unit tests feed it to
// the found-change encoders (the host half of the path, without a GPU), and
// hfdelta-gpu-check shares its test data. Also the generator of that data.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "change_finder.hpp"
#include "codec/change_rules.hpp"

namespace hfdelta::gpu {

// find(): changes, their differences and contexts, each chunk's sample.
inline Found reference_find(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b, std::size_t es,
                            ContextField f) {
  f = usable_field(f, es);
  Found r;
  r.es = es;
  r.elements = b.size() / es;
  r.chunks = rules::chunk_count(r.elements);
  r.start.assign(r.chunks + 1, 0);
  r.bytes.assign(r.chunks, 0);
  r.sample.assign(256 * r.chunks, 0);
  for (std::uint64_t e = 0; e < r.elements; ++e) {
    const std::uint64_t c = rules::chunk_of(e);
    const std::uint64_t va = rules::load_element(a.data() + e * es, es),
                        vb = rules::load_element(b.data() + e * es, es);
    if (rules::sampled(rules::index_in_chunk(e))) ++r.sample[256 * c + rules::context_of(va, f)];
    if (!rules::changed(va, vb)) continue;
    ++r.start[c + 1];
    r.bytes[c] += rules::changed_bytes(va, vb, es);
    r.pos.push_back(rules::index_in_chunk(e));
    const std::uint64_t d = rules::difference(va, vb, es);
    for (std::size_t k = 0; k < es; ++k) r.diff.push_back(static_cast<std::uint8_t>(d >> (8 * k)));
    r.ctx.push_back(rules::context_of(va, f));
  }
  for (std::uint64_t c = 0; c < r.chunks; ++c) r.start[c + 1] += r.start[c];
  return r;
}

// The CPU path's entry of a pair, what the found changes' must equal.
inline std::vector<std::uint8_t> cpu_entry(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b,
                                           std::size_t es, ContextField f, bool context) {
  Compressor c(3);
  std::vector<std::uint8_t> out;
  const ByteSink sink = [&](std::span<const std::uint8_t> s) { out.insert(out.end(), s.begin(), s.end()); };
  if (context)
    encode_context(c, a, b, es, f, sink);
  else
    encode_sparse(c, a, b, es, sink);
  return out;
}

// rank(): each change's count of base elements of its group before it in its chunk.
inline void reference_rank(std::span<const std::uint8_t> a, ContextField f, std::span<const ContextGroups> groups,
                           Found& r) {
  f = usable_field(f, r.es);
  r.rank.assign(r.changes(), 0);
  for (std::uint64_t c = 0; c < r.chunks; ++c) {
    const ContextGroups& gs = groups[c];
    std::uint64_t seen[kContextMaxGroups] = {}, j = r.start[c];
    const std::uint64_t e0 = c * kSparseChunkElements, e1 = std::min(r.elements, e0 + kSparseChunkElements);
    for (std::uint64_t e = e0; e < e1; ++e) {
      const unsigned g =
          rules::group_of(rules::context_of(rules::load_element(a.data() + e * r.es, r.es), f), gs.lo, gs.G);
      if (j < r.start[c + 1] && r.pos[j] == e - e0) r.rank[j++] = static_cast<std::uint32_t>(seen[g]);
      ++seen[g];
    }
  }
}

// Test data: a base of float-like elements of `es` bytes (sign and mantissa
// random, the exponent field over a few values, as trained weights have),
// and a new version with about `density` of its elements changed, mostly by
// a few units in the last place, one change in 64 to random bits.
struct Pair {
  std::vector<std::uint8_t> base, next;
};
inline Pair make_pair_data(std::uint64_t nbytes, std::size_t es, ContextField f, double density, std::uint64_t seed) {
  Pair p;
  p.base.resize(nbytes);
  p.next.resize(nbytes);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  auto rnd = [&]() {  // xorshift64*
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 0x2545f4914f6cdd1dull;
  };
  const std::uint64_t n = nbytes / es, ones = rules::element_ones(es);
  const std::uint64_t threshold = density >= 1 ? ~0ull : static_cast<std::uint64_t>(density * 18446744073709551615.0);
  for (std::uint64_t e = 0; e < n; ++e) {
    std::uint64_t v = rnd() & ones;
    if (f.bits) {  // the exponent within 6 of its middle
      const std::uint64_t fm = (std::uint64_t{1} << f.bits) - 1, mid = fm / 2;
      const std::uint64_t ex = mid - 6 + rnd() % 7;
      v = (v & ~(fm << f.shift)) | (ex & fm) << f.shift;
    }
    std::uint64_t w = v;
    if (rnd() < threshold) {
      const std::uint64_t r = rnd();
      w = r % 64 == 0 ? rnd() & ones : (v + ((r >> 8) % 7) - 3) & ones;
    }
    for (std::size_t k = 0; k < es; ++k) {
      p.base[e * es + k] = static_cast<std::uint8_t>(v >> (8 * k));
      p.next[e * es + k] = static_cast<std::uint8_t>(w >> (8 * k));
    }
  }
  for (std::uint64_t i = n * es; i < nbytes; ++i) p.base[i] = p.next[i] = static_cast<std::uint8_t>(rnd());
  return p;
}

}  // namespace hfdelta::gpu
