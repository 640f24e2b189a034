// The host half of the CUDA path, without a GPU: the element rules both paths
// share, and entries written from found changes (what ChangeFinder hands out,
// computed here by found_reference.hpp) byte for byte those of the CPU's
// encoders, over dtypes, odd sizes, several chunks and densities.
#include <doctest/doctest.h>

#include <vector>

#include "codec/change_rules.hpp"
#include "codec/codec.hpp"
#include "found_reference.hpp"
#include "hfdelta/safetensors.hpp"

using namespace hfdelta;
using Bytes = std::vector<std::uint8_t>;

using gpu::cpu_entry;

TEST_CASE("change rules: differences, zigzag, signed values, contexts, groups, chunks, sample") {
  using namespace rules;
  CHECK(element_ones(1) == 0xff);
  CHECK(element_ones(8) == ~0ull);
  CHECK(load_element(std::array<std::uint8_t, 4>{1, 2, 3, 4}.data(), 4) == 0x04030201u);
  CHECK(changed(1, 2));
  CHECK_FALSE(changed(7, 7));
  CHECK(changed_bytes(0x1234, 0x1235, 2) == 1);
  CHECK(changed_bytes(0x00ff, 0xff00, 2) == 2);
  CHECK(difference(0x0001, 0x0000, 2) == 0xffff);  // one down, modulo 2^16
  CHECK(zigzag(0xffff, 2) == 1);                   // -1
  // A difference added back gives the new element, for every element size.
  for (const std::size_t es : {1, 2, 4, 8}) {
    const std::uint64_t a = 0x0123456789abcdefull & element_ones(es), b = 0xfedcba9876543210ull & element_ones(es);
    CHECK(applied(a, difference(a, b, es), es) == b);
    CHECK(applied(b, difference(b, a, es), es) == a);
    std::array<std::uint8_t, 9> m{};
    store_element(m.data(), b, es);
    CHECK(load_element(m.data(), es) == b);
    CHECK(m[es] == 0);  // nothing past the element
  }
  CHECK(zigzag(1, 2) == 2);
  CHECK(zigzag(0x80, 1) == 0xff);  // -128
  CHECK(signed_value(0xffff, 0xffff).mag_minus1 == 0);
  CHECK(signed_value(0xffff, 0xffff).neg == 1);
  CHECK(signed_value(3, 0xff).mag_minus1 == 2);
  CHECK(context_of(0x3f80, ContextField{7, 8}) == 127);  // bf16 1.0: exponent 127
  CHECK(context_of(0x3f80, ContextField{7, 0}) == 0);
  const std::uint8_t lo[3] = {0, 100, 120};
  CHECK(group_of(99, lo, 3) == 0);
  CHECK(group_of(100, lo, 3) == 1);
  CHECK(group_of(255, lo, 3) == 2);
  CHECK(group_of(255, lo, 1) == 0);
  CHECK(chunked_elem_size(2, 7) == 1);
  CHECK(chunked_elem_size(4, 8) == 4);
  CHECK(chunk_count(0) == 0);
  CHECK(chunk_count(kSparseChunkElements) == 1);
  CHECK(chunk_count(kSparseChunkElements + 1) == 2);
  CHECK(index_in_chunk(kSparseChunkElements + 5) == 5);
  CHECK(sampled(63));
  CHECK_FALSE(sampled(64));
  CHECK(sampled(1024));
}

TEST_CASE("found changes: sparse and context entries byte for byte the CPU encoders'") {
  struct Case {
    const char* dtype;
    std::uint64_t nbytes;
    double density;
  };
  const std::uint64_t M = kSparseChunkElements;
  const Case cases[] = {
      {"BF16", 2, 1.0},          {"BF16", 66, 0.1},           {"BF16", 2 * (M + 4097), 0.01},
      {"BF16", 2 * 4099, 0.001}, {"BF16", 2 * 1001 + 1, 0.1},  // odd bytes: 1-byte elements, no field
      {"F16", 2 * 70001, 0.05},  {"F32", 4 * (M + 33), 0.02}, {"F8_E4M3", 2 * M + 7, 0.01},
      {"F8_E5M2", 5003, 0.1},    {"F64", 8 * 3001, 0.1},      {"I32", 4 * 5000, 0.1},
      {"BF16", 2 * 5000, 0.0},
  };
  for (const Case& k : cases) {
    const ChunkLayout l = chunk_layout(k.dtype, k.nbytes);
    CAPTURE(k.dtype);
    CAPTURE(k.nbytes);
    CAPTURE(k.density);
    const gpu::Pair p = gpu::make_pair_data(k.nbytes, l.es, l.field, k.density, k.nbytes);
    gpu::Found f = gpu::reference_find(p.base, p.next, l.es, l.field);
    CHECK(gpu::sparse_entry(f, k.nbytes, 3) == cpu_entry(p.base, p.next, l.es, l.field, false));
    const std::vector<ContextGroups> groups = gpu::context_groups_of(f, l.field);
    gpu::reference_rank(p.base, l.field, groups, f);
    CHECK(gpu::context_entry(f, k.nbytes, l.field, groups, 3) == cpu_entry(p.base, p.next, l.es, l.field, true));
  }
}

TEST_CASE("found changes: a wrong rank or count changes the entry (the comparison can fail)") {
  const ChunkLayout l = chunk_layout("BF16", 2 * 20000);
  const gpu::Pair p = gpu::make_pair_data(2 * 20000, l.es, l.field, 0.05, 9);
  gpu::Found f = gpu::reference_find(p.base, p.next, l.es, l.field);
  const std::vector<ContextGroups> groups = gpu::context_groups_of(f, l.field);
  gpu::reference_rank(p.base, l.field, groups, f);
  REQUIRE(f.rank.size() > 10);
  f.rank[5] += 1;
  CHECK(gpu::context_entry(f, 2 * 20000, l.field, groups, 3) != cpu_entry(p.base, p.next, l.es, l.field, true));
  f.pos[3] += 1;
  CHECK(gpu::sparse_entry(f, 2 * 20000, 3) != cpu_entry(p.base, p.next, l.es, l.field, false));
}
