// Unit tests of the byte-level delta codecs (docs/format.md, "Encodings"): round trips,
// the published frame layouts, hostile frames, change counting.
#include <doctest/doctest.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <zstd.h>

#include "codec/codec.hpp"
#include "hfdelta/error.hpp"
#include "unit_util.hpp"

using namespace hfdelta;
using unit::contains;
using unit::error_of;
using unit::TempDir;

namespace {

using Bytes = std::vector<std::uint8_t>;

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * 1024;

Bytes random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

// Bytes that compress somewhat (runs and a small alphabet), deterministic.
Bytes patterned_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>((i / 7) % 13 + (rng() % 4 == 0 ? rng() % 5 : 0));
  return b;
}

void put_le32(Bytes& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

// Any content as one zstd frame, with or without the content size and checksum.
Bytes zframe(const Bytes& content, bool with_size = true, bool checksum = true) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  REQUIRE(c != nullptr);
  REQUIRE_FALSE(ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3)));
  REQUIRE_FALSE(ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, with_size ? 1 : 0)));
  REQUIRE_FALSE(ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, checksum ? 1 : 0)));
  Bytes out(ZSTD_compressBound(content.size()));
  const std::size_t r = ZSTD_compress2(c, out.data(), out.size(), content.data(), content.size());
  ZSTD_freeCCtx(c);
  REQUIRE_FALSE(ZSTD_isError(r));
  out.resize(r);
  return out;
}

// Plain one-shot decompression, as any zstd reader would do it.
Bytes zstd_plain(const Bytes& frame) {
  const unsigned long long n = ZSTD_getFrameContentSize(frame.data(), frame.size());
  REQUIRE(n != ZSTD_CONTENTSIZE_ERROR);
  REQUIRE(n != ZSTD_CONTENTSIZE_UNKNOWN);
  Bytes out(static_cast<std::size_t>(n));
  const std::size_t r = ZSTD_decompress(out.data(), out.size(), frame.data(), frame.size());
  REQUIRE_FALSE(ZSTD_isError(r));
  REQUIRE(r == n);
  return out;
}

Bytes encode_xor_frame(Compressor& c, const Bytes& a, const Bytes& b) {
  Bytes frame;
  const std::uint64_t n =
      encode_xor(c, a, b, [&](std::span<const std::uint8_t> s) { frame.insert(frame.end(), s.begin(), s.end()); });
  CHECK(n == frame.size());
  return frame;
}

Bytes encode_overwrite_frame(Compressor& c, const Bytes& a, const Bytes& b) {
  const std::uint64_t changed = count_changes(a, b, 1).bytes;
  Bytes frame;
  const std::uint64_t n = encode_overwrite(
      c, a, b, changed, [&](std::span<const std::uint8_t> s) { frame.insert(frame.end(), s.begin(), s.end()); });
  CHECK(n == frame.size());
  return frame;
}

// Applies an xor frame to a copy of `old`, checking every piece is in range and
// pieces arrive in order.
Bytes apply_xor(Decompressor& d, const Bytes& old, std::span<const std::uint8_t> frame, bool* out_of_range = nullptr) {
  Bytes t = old;
  std::uint64_t expect_off = 0;
  decode_xor(d, frame, old.size(), "t.xor", [&](std::uint64_t off, std::span<const std::uint8_t> piece) {
    if (off != expect_off || off > t.size() || piece.size() > t.size() - off) {
      if (out_of_range) *out_of_range = true;
      FAIL("xor patch out of range: offset " << off << " size " << piece.size());
    }
    for (std::size_t i = 0; i < piece.size(); ++i) t[off + i] ^= piece[i];
    expect_off = off + piece.size();
  });
  return t;
}

Bytes apply_overwrite(Decompressor& dp, Decompressor& dv, const Bytes& old, std::span<const std::uint8_t> frame,
                      std::uint64_t nbytes, bool* out_of_range = nullptr, std::uint64_t* patched = nullptr) {
  Bytes t = old;
  std::optional<std::uint64_t> prev;
  decode_overwrite(dp, dv, frame, nbytes, "t.ow",
                   [&](std::span<const std::uint64_t> pos, std::span<const std::uint8_t> val) {
                     bool bad = pos.size() != val.size();
                     for (auto p : pos) {
                       if (p >= t.size() || p >= nbytes || (prev && p <= *prev)) bad = true;
                       prev = p;
                     }
                     if (bad) {
                       if (out_of_range) *out_of_range = true;
                       FAIL("overwrite patch out of range or out of order");
                     }
                     for (std::size_t i = 0; i < pos.size(); ++i) t[pos[i]] = val[i];
                     if (patched) *patched += pos.size();
                   });
  return t;
}

// The published overwrite layout: u32 K, K ascending u32 positions, K values.
Bytes expected_overwrite_content(const Bytes& a, const Bytes& b) {
  Bytes out;
  std::vector<std::uint32_t> pos;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) pos.push_back(static_cast<std::uint32_t>(i));
  put_le32(out, static_cast<std::uint32_t>(pos.size()));
  for (auto p : pos) put_le32(out, p);
  for (auto p : pos) out.push_back(b[p]);
  return out;
}

Bytes xor_of(const Bytes& a, const Bytes& b) {
  Bytes x(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) x[i] = a[i] ^ b[i];
  return x;
}

// Encodes both ways, checks the frames and the round trips.
void check_round_trip(const Bytes& a, const Bytes& b) {
  REQUIRE(a.size() == b.size());
  Compressor c(1);
  Decompressor d1, d2;

  const Bytes xf = encode_xor_frame(c, a, b);
  CHECK(ZSTD_findFrameCompressedSize(xf.data(), xf.size()) == xf.size());  // exactly one frame
  CHECK(ZSTD_getFrameContentSize(xf.data(), xf.size()) == a.size());
  CHECK(zstd_plain(xf) == xor_of(a, b));
  CHECK(apply_xor(d1, a, xf) == b);

  const Bytes of = encode_overwrite_frame(c, a, b);
  CHECK(ZSTD_findFrameCompressedSize(of.data(), of.size()) == of.size());
  const Bytes content = zstd_plain(of);
  const Bytes want = expected_overwrite_content(a, b);
  REQUIRE(content.size() == want.size());
  CHECK(content == want);
  CHECK(apply_overwrite(d1, d2, a, of, a.size()) == b);
  // Idempotent: applying it to the already new bytes changes nothing.
  CHECK(apply_overwrite(d1, d2, b, of, b.size()) == b);
}

void expect_bad_frame(const std::optional<Error>& e, const std::string& what) {
  REQUIRE_MESSAGE(e.has_value(), "no Error thrown");
  INFO("message: " << e->what());
  CHECK(e->code() == Exit::bad_input);
  CHECK(contains(e->what(), what));
}

std::optional<Error> xor_error(const Bytes& frame, std::uint64_t nbytes, bool* out_of_range,
                               std::uint64_t* calls = nullptr) {
  Decompressor d;
  return error_of([&] {
    decode_xor(d, frame, nbytes, "t.xor", [&](std::uint64_t off, std::span<const std::uint8_t> piece) {
      if (calls) ++*calls;
      if (off > nbytes || piece.size() > nbytes - off) *out_of_range = true;
    });
  });
}

std::optional<Error> overwrite_error(const Bytes& frame, std::uint64_t nbytes, bool* out_of_range,
                                     std::uint64_t* patched = nullptr) {
  Decompressor dp, dv;
  std::optional<std::uint64_t> prev;
  return error_of([&] {
    decode_overwrite(dp, dv, frame, nbytes, "t.ow",
                     [&](std::span<const std::uint64_t> pos, std::span<const std::uint8_t> val) {
                       if (pos.size() != val.size()) *out_of_range = true;
                       for (auto p : pos) {
                         if (p >= nbytes || (prev && p <= *prev)) *out_of_range = true;
                         prev = p;
                       }
                       if (patched) *patched += pos.size();
                     });
  });
}

Bytes overwrite_content(std::uint32_t k, const std::vector<std::uint32_t>& pos, const Bytes& vals) {
  Bytes out;
  put_le32(out, k);
  for (auto p : pos) put_le32(out, p);
  out.insert(out.end(), vals.begin(), vals.end());
  return out;
}

}  // namespace

// ---- names ---------------------------------------------------------------------

TEST_CASE("codec: encoding names") {
  CHECK(encoding_name(Encoding::xor_bytes) == "xor");
  CHECK(encoding_name(Encoding::overwrite) == "overwrite");
  CHECK(parse_encoding("xor") == Encoding::xor_bytes);
  CHECK(parse_encoding("overwrite") == Encoding::overwrite);
  CHECK(encoding_name(Encoding::sparse) == "sparse");
  CHECK(parse_encoding("sparse") == Encoding::sparse);
  CHECK(encoding_name(Encoding::stack) == "stack");
  CHECK(parse_encoding("stack") == Encoding::stack);
  for (const char* s : {"", "XOR", "xor ", "Overwrite", "Sparse", "auto", "dense", "bitmask", "Stack"}) {
    CAPTURE(s);
    CHECK_FALSE(parse_encoding(s).has_value());
  }
}

// ---- stacked entries -------------------------------------------------------------

TEST_CASE("codec: a stacked entry's head round trip, and every malformed head refused") {
  const std::vector<std::uint8_t> a{1, 2, 3}, b{}, c{9, 8, 7, 6, 5};
  std::vector<StackLayer> parts{{Encoding::xor_bytes, a.size(), Hash128{1, 2}, {}},
                                {Encoding::sparse, b.size(), Hash128{3, 4}, {}},
                                {Encoding::overwrite, c.size(), Hash128{0xfedcba9876543210ull, 5}, {}}};
  std::vector<std::uint8_t> entry = stack_head(parts);
  REQUIRE(entry.size() == kStackHeadSize + 3 * kStackLayerSize);
  CHECK(std::string(entry.begin(), entry.begin() + 4) == "HFK1");
  const std::size_t head = entry.size();
  for (const auto* p : {&a, &b, &c}) entry.insert(entry.end(), p->begin(), p->end());
  const Hash128 last = parts.back().hash;
  const std::vector<StackLayer> r = read_stack(entry, last, "e");
  REQUIRE(r.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(r[i].enc == parts[i].enc);
    CHECK(r[i].size == parts[i].size);
    CHECK(r[i].hash == parts[i].hash);
    CHECK(r[i].bytes.size() == parts[i].size);
  }
  CHECK(r[0].bytes.data() == entry.data() + head);
  CHECK(std::vector<std::uint8_t>(r[2].bytes.begin(), r[2].bytes.end()) == c);

  auto refused = [&](std::vector<std::uint8_t> e, const char* why) {
    CAPTURE(why);
    const auto err = error_of([&] { read_stack(e, last, "model-00000-of-00001.safetensors: entry 'w'"); });
    REQUIRE(err.has_value());
    CHECK(err->code() == Exit::bad_input);
    CHECK(std::string(err->what()).find("entry 'w'") != std::string::npos);
  };
  refused({}, "empty");
  refused({'H', 'F', 'K'}, "shorter than a head");
  auto edit = [&](std::size_t at, std::uint8_t v) {
    std::vector<std::uint8_t> e = entry;
    e[at] = v;
    return e;
  };
  refused(edit(3, '2'), "another magic");
  refused(edit(4, 0), "no parts");
  refused(edit(4, 4), "more parts than the head holds");
  refused(edit(7, 0x80), "a huge part count");
  refused(edit(kStackHeadSize, 5), "an unknown encoding (5; 3 is context, 4 parts)");
  // 4: a parts entry (revision 6), whose own head the delta reader reads.
  CHECK(read_stack(edit(kStackHeadSize, 4), last, "e")[0].enc == Encoding::parts);
  refused(edit(kStackHeadSize, 0xff), "an unknown encoding (255)");
  refused(edit(kStackHeadSize + 4, 1), "a non-zero reserved word");
  refused(edit(kStackHeadSize + 8, 4), "a part longer than the entry holds");
  refused(edit(kStackHeadSize + 15, 0x80), "a part length that would wrap");
  refused(edit(kStackHeadSize + 8, 2), "a part shorter, leaving bytes at the end");
  std::vector<std::uint8_t> longer = entry;
  longer.push_back(0);
  refused(longer, "a byte after the last part");
  std::vector<std::uint8_t> shorter = entry;
  shorter.pop_back();
  refused(shorter, "the last part cut short");
  // A stack holds entries, never another stack.
  parts[1].enc = Encoding::stack;
  CHECK(error_of([&] { stack_head(parts); }).has_value());
}

// ---- count_changes -------------------------------------------------------------

TEST_CASE("codec: count_changes counts elements once and bytes separately") {
  Bytes a(256, 0x10);
  SUBCASE("identical") {
    for (std::size_t es : {1, 2, 4, 8}) {
      const auto c = count_changes(a, a, es);
      CHECK(c.elements == 0);
      CHECK(c.bytes == 0);
    }
  }
  SUBCASE("hand-made changes, inside the fast 64-byte blocks and in the tail") {
    Bytes b = a;
    // Element 0 (bytes 0..7): bytes 0 and 1 changed. Byte 7 changed.
    b[0] = 1;
    b[1] = 2;
    b[7] = 3;
    // Byte 70 only.
    b[70] = 4;
    // Bytes 200..203: four bytes in a row.
    for (int i = 200; i < 204; ++i) b[i] = 5;
    // Last byte.
    b[255] = 6;
    const Bytes tail(a.begin(), a.begin() + 250), tailb(b.begin(), b.begin() + 250);  // 250: 58-byte tail
    struct Want {
      std::size_t es;
      std::uint64_t elements;
    };
    // es=1: 8 bytes each its own element.
    // es=2: {0,1}->e0, 7->e3, 70->e35, 200..203->e100,e101, 255->e127 => 6
    // es=4: {0,1}->e0, 7->e1, 70->e17, 200..203->e50, 255->e63 => 5
    // es=8: {0,1,7}->e0, 70->e8, 200..203->e25, 255->e31 => 4
    for (const Want w : {Want{1, 9}, Want{2, 6}, Want{4, 5}, Want{8, 4}}) {
      CAPTURE(w.es);
      const auto c = count_changes(a, b, w.es);
      CHECK(c.bytes == 9);
      CHECK(c.elements == w.elements);
    }
    // Without the last 6 bytes (the tail is not a multiple of 64): byte 255 gone.
    for (const Want w : {Want{1, 8}, Want{2, 5}, Want{4, 4}, Want{8, 3}}) {
      CAPTURE(w.es);
      const auto c = count_changes(tail, tailb, w.es);
      CHECK(c.bytes == 8);
      CHECK(c.elements == w.elements);
    }
    // Element size 0 (unknown dtype) counts bytes.
    CHECK(count_changes(a, b, 0).elements == 9);
  }
  SUBCASE("every byte of one element changed counts it once") {
    for (std::size_t es : {2, 4, 8}) {
      CAPTURE(es);
      Bytes b = a;
      for (std::size_t k = 0; k < es; ++k) b[64 + es + k] ^= 0xff;
      const auto c = count_changes(a, b, es);
      CHECK(c.elements == 1);
      CHECK(c.bytes == es);
    }
  }
  SUBCASE("random sparse changes agree with a naive count") {
    std::mt19937_64 rng(42);
    for (std::size_t n : {0, 8, 64, 200, 4096 + 8, 100'000}) {
      const Bytes x = random_bytes(n, n + 1);
      Bytes y = x;
      for (std::size_t i = 0; i < n; ++i)
        if (rng() % 50 == 0) y[i] ^= static_cast<std::uint8_t>(1 + rng() % 255);
      for (std::size_t es : {1, 2, 4, 8}) {
        CAPTURE(n);
        CAPTURE(es);
        std::uint64_t bytes = 0, elems = 0;
        for (std::size_t e = 0; e < n; e += es) {
          std::uint64_t d = 0;
          for (std::size_t k = 0; k < es && e + k < n; ++k) d += x[e + k] != y[e + k];
          bytes += d;
          elems += d != 0;
        }
        const auto c = count_changes(x, y, es);
        CHECK(c.bytes == bytes);
        CHECK(c.elements == elems);
      }
    }
  }
}

// ---- round trips ---------------------------------------------------------------

TEST_CASE("codec: round trips of both encodings") {
  for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{65}, std::size_t{257}, 4 * kKiB + 1}) {
    CAPTURE(n);
    const Bytes a = random_bytes(n, 1000 + n);
    // No change.
    check_round_trip(a, a);
    // Every byte changed.
    Bytes all = a;
    for (auto& x : all) x = static_cast<std::uint8_t>(~x);
    check_round_trip(a, all);
    // Only the first byte.
    Bytes first = a;
    first.front() ^= 0x80;
    check_round_trip(a, first);
    // Only the last byte.
    Bytes last = a;
    last[n - 1] ^= 0x01;
    check_round_trip(a, last);
  }
}

TEST_CASE("codec: round trips across several internal chunks") {
  for (std::size_t n : {256 * kKiB - 1, 256 * kKiB, 256 * kKiB + 1, kMiB + 3}) {
    CAPTURE(n);
    const Bytes a = patterned_bytes(n, n);
    check_round_trip(a, a);
    // Every byte changed.
    Bytes all = a;
    for (auto& x : all) x ^= 0x5a;
    check_round_trip(a, all);
    // First and last byte.
    Bytes ends = a;
    ends.front() ^= 1;
    ends.back() ^= 2;
    check_round_trip(a, ends);
    // Random sparse changes, about 1%, fixed seed.
    std::mt19937_64 rng(7 + n);
    Bytes sparse = a;
    std::size_t changed = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (rng() % 100 == 0) sparse[i] ^= static_cast<std::uint8_t>(1 + rng() % 255), ++changed;
    CHECK(changed > n / 200);
    CHECK(count_changes(a, sparse, 1).bytes == changed);
    check_round_trip(a, sparse);
    // Changes on both sides of every chunk boundary.
    Bytes edges = a;
    for (std::size_t k = 256 * kKiB; k < n + 1; k += 256 * kKiB) {
      edges[k - 1] ^= 0x11;
      if (k < n) edges[k] ^= 0x22;
    }
    check_round_trip(a, edges);
  }
}

TEST_CASE("codec: an empty tensor round-trips") {
  const Bytes e;
  Compressor c(1);
  Decompressor d1, d2;
  const Bytes xf = encode_xor_frame(c, e, e);
  CHECK(ZSTD_getFrameContentSize(xf.data(), xf.size()) == 0);
  CHECK(apply_xor(d1, e, xf).empty());
  const Bytes of = encode_overwrite_frame(c, e, e);
  CHECK(zstd_plain(of) == Bytes{0, 0, 0, 0});
  CHECK(apply_overwrite(d1, d2, e, of, 0).empty());
}

TEST_CASE("codec: the overwrite frame is the published layout, byte for byte") {
  SUBCASE("small") {
    const Bytes a{10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
    Bytes b = a;
    b[0] = 0xaa;
    b[3] = 0x00;
    b[9] = 0xff;
    Compressor c(1);
    const Bytes content = zstd_plain(encode_overwrite_frame(c, a, b));
    const Bytes want{3, 0, 0, 0, /*positions*/ 0, 0, 0, 0, 3, 0, 0, 0, 9, 0, 0, 0, /*values*/ 0xaa, 0x00, 0xff};
    CHECK(content == want);
  }
  SUBCASE("positions needing all four bytes, little-endian") {
    Bytes a(0x1020304 + 2, 0);
    Bytes b = a;
    b[0x102] = 1;
    b[0x10101] = 2;
    b[0x1020304] = 3;
    b[0x1020305] = 4;
    Compressor c(1);
    const Bytes content = zstd_plain(encode_overwrite_frame(c, a, b));
    const Bytes want{4,    0,    0,    0,    0x02, 0x01, 0x00, 0x00, 0x01, 0x01, 0x01, 0x00,
                     0x04, 0x03, 0x02, 0x01, 0x05, 0x03, 0x02, 0x01, 1,    2,    3,    4};
    CHECK(content == want);
    Decompressor d1, d2;
    CHECK(apply_overwrite(d1, d2, a, encode_overwrite_frame(c, a, b), a.size()) == b);
  }
}

TEST_CASE("codec: overwrite positions are strictly ascending and inside the tensor") {
  const std::size_t n = 300'000;
  const Bytes a = patterned_bytes(n, 3);
  Bytes b = a;
  std::mt19937_64 rng(99);
  for (std::size_t i = 0; i < n; ++i)
    if (rng() % 3 == 0) b[i] ^= 0x40;  // ~100k changes: several decode batches
  Compressor c(1);
  Decompressor dp, dv;
  const Bytes frame = encode_overwrite_frame(c, a, b);
  std::vector<std::uint64_t> seen;
  std::size_t calls = 0;
  std::size_t bad_order = 0, bad_range = 0, bad_value = 0;
  decode_overwrite(dp, dv, frame, n, "t.ow",
                   [&](std::span<const std::uint64_t> pos, std::span<const std::uint8_t> val) {
                     ++calls;
                     REQUIRE(pos.size() == val.size());
                     for (std::size_t i = 0; i < pos.size(); ++i) {
                       if (pos[i] >= n) {
                         ++bad_range;
                         continue;
                       }
                       if (!seen.empty() && pos[i] <= seen.back()) ++bad_order;
                       if (val[i] != b[pos[i]]) ++bad_value;
                       seen.push_back(pos[i]);
                     }
                   });
  CHECK(bad_range == 0);
  CHECK(bad_order == 0);
  CHECK(bad_value == 0);
  CHECK(seen.size() == count_changes(a, b, 1).bytes);
  // Exactly the changed positions.
  std::size_t j = 0, missing = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) missing += !(j < seen.size() && seen[j++] == i);
  CHECK(missing == 0);
  CHECK(calls > 1);
}

TEST_CASE("codec: contexts are reusable, also after a failure") {
  Compressor c(1);
  Decompressor d, dp, dv;
  const Bytes a1 = random_bytes(5000, 1), a2 = random_bytes(70'000, 2);
  Bytes b1 = a1, b2 = a2;
  b1[17] ^= 1;
  b2[69'999] ^= 1;
  CHECK(apply_xor(d, a1, encode_xor_frame(c, a1, b1)) == b1);
  // A corrupt frame fails ...
  Bytes broken = encode_xor_frame(c, a2, b2);
  broken.resize(broken.size() / 2);
  bool oor = false;
  CHECK(error_of([&] { apply_xor(d, a2, broken, &oor); }).has_value());
  CHECK_FALSE(oor);
  // ... and the same contexts go on working.
  CHECK(apply_xor(d, a2, encode_xor_frame(c, a2, b2)) == b2);
  CHECK(apply_overwrite(dp, dv, a1, encode_overwrite_frame(c, a1, b1), a1.size()) == b1);
  // An encoder told the wrong change count fails without emitting a frame that
  // could pass for a good one, and the compressor is still usable.
  const auto e = error_of([&] { encode_overwrite(c, a1, b1, 5, [](std::span<const std::uint8_t>) {}); });
  REQUIRE(e);
  CHECK(e->code() == Exit::failure);
  CHECK(apply_overwrite(dp, dv, a2, encode_overwrite_frame(c, a2, b2), a2.size()) == b2);
}

// ---- hostile frames: xor -------------------------------------------------------

TEST_CASE("codec: hostile xor frames are refused as bad input") {
  const std::size_t n = 100'000;
  const Bytes a = patterned_bytes(n, 11);
  Bytes b = a;
  for (std::size_t i = 0; i < n; i += 97) b[i] ^= 0x33;
  Compressor c(1);
  const Bytes good = encode_xor_frame(c, a, b);
  {
    Decompressor d;
    REQUIRE(apply_xor(d, a, good) == b);
  }
  bool oor = false;

  SUBCASE("not a zstd frame") {
    const Bytes junk{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '!'};
    expect_bad_frame(xor_error(junk, n, &oor), "t.xor");
    expect_bad_frame(xor_error(Bytes{}, n, &oor), "t.xor");
    expect_bad_frame(xor_error(Bytes(64, 0), n, &oor), "t.xor");
  }
  SUBCASE("truncated at several points") {
    for (std::size_t cut : {std::size_t{1}, std::size_t{4}, std::size_t{5}, std::size_t{6}, std::size_t{9},
                            good.size() / 3, good.size() / 2, good.size() - 5, good.size() - 4, good.size() - 1}) {
      CAPTURE(cut);
      const Bytes t(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut));
      expect_bad_frame(xor_error(t, n, &oor), "t.xor");
    }
  }
  SUBCASE("followed by extra bytes") {
    Bytes t = good;
    t.push_back(0);
    expect_bad_frame(xor_error(t, n, &oor), "extra");
    Bytes two = good;
    two.insert(two.end(), good.begin(), good.end());
    expect_bad_frame(xor_error(two, n, &oor), "t.xor");
  }
  SUBCASE("decodes to more or fewer bytes than the tensor") {
    const Bytes x = xor_of(a, b);
    Bytes more = x;
    more.push_back(0);
    Bytes fewer(x.begin(), x.end() - 1);
    for (bool with_size : {true, false}) {
      CAPTURE(with_size);
      expect_bad_frame(xor_error(zframe(more, with_size), n, &oor), "t.xor");
      expect_bad_frame(xor_error(zframe(fewer, with_size), n, &oor), "t.xor");
      expect_bad_frame(xor_error(zframe(Bytes{}, with_size), n, &oor), "t.xor");
      // Far more than the tensor.
      expect_bad_frame(xor_error(zframe(Bytes(3 * n, 0), with_size), n, &oor), "t.xor");
    }
    // A frame of the right size with no content size field is fine.
    Decompressor d;
    CHECK(apply_xor(d, a, zframe(x, false)) == b);
    CHECK(apply_xor(d, a, zframe(x, true, false)) == b);
  }
  SUBCASE("a claimed huge tensor does not make the decoder trust the frame") {
    expect_bad_frame(xor_error(zframe(Bytes(10, 1), false), std::uint64_t{1} << 40, &oor), "t.xor");
  }
  SUBCASE("corrupted content, in a frame with a content checksum") {
    // The encoder writes none (the slime layout's publishers do not: the
    // entry's checksum covers the tensor); a frame that has one is checked.
    CHECK((good[4] & 0x04) == 0);
    const Bytes checked = zframe(xor_of(a, b));
    for (std::size_t at : {checked.size() / 2, checked.size() / 3, checked.size() - 8, std::size_t{20}}) {
      CAPTURE(at);
      Bytes t = checked;
      t[at] ^= 0x41;
      expect_bad_frame(xor_error(t, n, &oor), "t.xor");
    }
  }
  CHECK_FALSE(oor);
}

// ---- hostile frames: overwrite -------------------------------------------------

TEST_CASE("codec: hostile overwrite frames are refused as bad input") {
  const std::uint64_t n = 10;
  bool oor = false;
  std::uint64_t patched = 0;

  SUBCASE("a well-formed frame passes these helpers") {
    REQUIRE_FALSE(overwrite_error(zframe(overwrite_content(2, {1, 9}, {7, 8})), n, &oor, &patched).has_value());
    CHECK(patched == 2);
    patched = 0;
    REQUIRE_FALSE(overwrite_error(zframe(overwrite_content(0, {}, {})), n, &oor, &patched).has_value());
    CHECK(patched == 0);
  }
  SUBCASE("not a zstd frame") {
    expect_bad_frame(overwrite_error(Bytes{1, 0, 0, 0, 2, 0, 0, 0, 9}, n, &oor), "t.ow");
    expect_bad_frame(overwrite_error(Bytes{}, n, &oor), "t.ow");
  }
  for (bool with_size : {true, false}) {
    CAPTURE(with_size);
    {  // K larger than the tensor
      Bytes content = overwrite_content(11, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9}, Bytes(11, 1));
      expect_bad_frame(overwrite_error(zframe(content, with_size), n, &oor, &patched), "t.ow");
      expect_bad_frame(overwrite_error(zframe(overwrite_content(0xffffffffu, {}, {}), with_size), n, &oor, &patched),
                       "t.ow");
    }
    {  // position out of range
      expect_bad_frame(overwrite_error(zframe(overwrite_content(1, {10}, {1}), with_size), n, &oor, &patched),
                       "outside");
      expect_bad_frame(
          overwrite_error(zframe(overwrite_content(2, {0, 0xffffffffu}, {1, 2}), with_size), n, &oor, &patched),
          "t.ow");
    }
    {  // positions not ascending or duplicated
      expect_bad_frame(overwrite_error(zframe(overwrite_content(2, {5, 3}, {1, 2}), with_size), n, &oor, &patched),
                       "ascending");
      expect_bad_frame(overwrite_error(zframe(overwrite_content(2, {3, 3}, {1, 2}), with_size), n, &oor, &patched),
                       "ascending");
      expect_bad_frame(
          overwrite_error(zframe(overwrite_content(3, {0, 9, 1}, {1, 2, 3}), with_size), n, &oor, &patched), "t.ow");
    }
    {  // fewer or more value bytes than K
      expect_bad_frame(overwrite_error(zframe(overwrite_content(2, {1, 2}, {7}), with_size), n, &oor, &patched),
                       "t.ow");
      expect_bad_frame(overwrite_error(zframe(overwrite_content(2, {1, 2}, {}), with_size), n, &oor, &patched), "t.ow");
      // More values than K: without a declared content size this is only
      // seen at the end of the frame, after the (in-range) batch went out.
      std::uint64_t patched_more = 0;
      expect_bad_frame(
          overwrite_error(zframe(overwrite_content(2, {1, 2}, {7, 8, 9}), with_size), n, &oor, &patched_more), "t.ow");
      CHECK(patched_more == (with_size ? 0 : 2));
      // Fewer positions than K (the frame ends inside the positions).
      expect_bad_frame(overwrite_error(zframe(overwrite_content(3, {1}, {}), with_size), n, &oor, &patched), "t.ow");
    }
    {  // shorter than the count
      expect_bad_frame(overwrite_error(zframe(Bytes{1, 0}, with_size), n, &oor, &patched), "t.ow");
      expect_bad_frame(overwrite_error(zframe(Bytes{}, with_size), n, &oor, &patched), "t.ow");
    }
    {  // huge K with a claimed huge tensor and a tiny frame
      expect_bad_frame(overwrite_error(zframe(overwrite_content(0xffffffffu, {}, {}), with_size),
                                       std::uint64_t{1} << 40, &oor, &patched),
                       "t.ow");
    }
    // None of the frames above may reach the callback.
    CHECK(patched == 0);
  }
  CHECK_FALSE(oor);
}

TEST_CASE("codec: hostile overwrite frames from a real frame") {
  const std::size_t n = 200'000;
  const Bytes a = patterned_bytes(n, 5);
  Bytes b = a;
  for (std::size_t i = 0; i < n; i += 3) b[i] ^= 0x7;  // > one decode batch of positions
  Compressor c(1);
  const Bytes good = encode_overwrite_frame(c, a, b);
  bool oor = false;

  SUBCASE("truncated at several points") {
    for (std::size_t cut : {std::size_t{1}, std::size_t{5}, std::size_t{8}, good.size() / 4, good.size() / 2,
                            good.size() - 4, good.size() - 1}) {
      CAPTURE(cut);
      expect_bad_frame(overwrite_error(Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut)), n, &oor),
                       "t.ow");
    }
  }
  SUBCASE("followed by extra bytes") {
    Bytes t = good;
    t.push_back(0x28);
    expect_bad_frame(overwrite_error(t, n, &oor), "t.ow");
  }
  SUBCASE("corrupted content, in a frame with a content checksum") {
    CHECK((good[4] & 0x04) == 0);  // as the xor frames (above)
    const Bytes checked = zframe(zstd_plain(good));
    for (std::size_t at : {checked.size() / 2, checked.size() / 3, checked.size() - 8, std::size_t{20}}) {
      CAPTURE(at);
      Bytes t = checked;
      t[at] ^= 0x41;
      expect_bad_frame(overwrite_error(t, n, &oor), "t.ow");
    }
  }
  SUBCASE("tensor smaller than the frame assumes") {
    expect_bad_frame(overwrite_error(good, n - 2, &oor), "outside");
    expect_bad_frame(overwrite_error(good, 1, &oor), "t.ow");
  }
  SUBCASE("a bad position after the first batch") {
    // 20000 ascending positions, then one that goes backwards.
    std::vector<std::uint32_t> pos;
    for (std::uint32_t i = 0; i < 20'000; ++i) pos.push_back(i * 2);
    pos.push_back(5);
    std::uint64_t patched = 0;
    expect_bad_frame(
        overwrite_error(zframe(overwrite_content(static_cast<std::uint32_t>(pos.size()), pos, Bytes(pos.size(), 1))), n,
                        &oor, &patched),
        "ascending");
    CHECK(patched < pos.size());
  }
  CHECK_FALSE(oor);
}

// ---- limits --------------------------------------------------------------------

TEST_CASE("codec: overwrite refuses tensors of 4 GiB or more before reading them") {
  // Untouched anonymous pages cost nothing; the check must come before any read.
  for (std::uint64_t size : {(std::uint64_t{4} << 30) + 1, std::uint64_t{4} << 30}) {
    CAPTURE(size);
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    REQUIRE(p != MAP_FAILED);
    const std::span<const std::uint8_t> big(static_cast<const std::uint8_t*>(p), size);
    Compressor c(1);
    bool sink_called = false;
    const auto e =
        error_of([&] { encode_overwrite(c, big, big, 0, [&](std::span<const std::uint8_t>) { sink_called = true; }); });
    ::munmap(p, size);
    REQUIRE(e);
    INFO(e->what());
    CHECK(e->code() == Exit::unsupported);
    CHECK(contains(e->what(), std::to_string(size)));
    CHECK(contains(e->what(), "xor"));
    CHECK_FALSE(sink_called);
  }
}
