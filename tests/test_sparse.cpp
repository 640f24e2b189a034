// The sparse encoding and per-tensor "auto" choice: round trips on edge cases,
// positions past 4 GiB, hostile entries, and auto never larger than xor.
#include <doctest/doctest.h>

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <boost/filesystem.hpp>
#include <zstd.h>

#include "hfdelta/apply.hpp"
#include "hfdelta/codec.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/diff.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/io.hpp"
#include "hfdelta/safetensors.hpp"

using namespace hfdelta;
namespace fs = boost::filesystem;
using Bytes = std::vector<std::uint8_t>;

namespace {

Bytes encode(const Bytes& a, const Bytes& b, std::size_t es) {
  Compressor c(3);
  Bytes out;
  const std::uint64_t n = encode_sparse(c, a, b, es, [&](std::span<const std::uint8_t> s) { out.insert(out.end(), s.begin(), s.end()); });
  CHECK(n == out.size());
  return out;
}

// Applies a sparse entry to a copy of `a`, checking what the decoder hands out.
Bytes patched(const Bytes& a, const Bytes& entry) {
  Bytes r = a;
  std::uint64_t last = 0;
  bool first = true;
  decode_sparse(entry, a.size(), "test", [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> x, std::size_t es, SparseOp op) {
    REQUIRE(x.size() == offs.size() * es);
    for (std::size_t i = 0; i < offs.size(); ++i) {
      REQUIRE(offs[i] + es <= r.size());
      REQUIRE(offs[i] % es == 0);
      if (!first) REQUIRE(offs[i] > last);
      first = false;
      last = offs[i];
      sparse_apply_value(r.data() + offs[i], x.data() + i * es, es, op);
    }
  });
  return r;
}

Bytes random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes v(n);
  for (auto& x : v) x = static_cast<std::uint8_t>(rng());
  return v;
}

std::optional<Exit> error_code(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return std::nullopt;
}

void put64(Bytes& v, std::uint64_t x) {
  for (int i = 0; i < 8; ++i) v.push_back(static_cast<std::uint8_t>(x >> (8 * i)));
}

Bytes zframe(const Bytes& in) {
  Bytes out(ZSTD_compressBound(in.size()));
  out.resize(ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 3));
  return out;
}

// A hand-built entry: es-byte elements, given positions (ascending) and XOR bytes.
Bytes handmade(std::uint32_t es, std::uint64_t nbytes, const std::vector<std::uint64_t>& elems, const Bytes& xors) {
  Bytes out{'H', 'F', 'S', '1'};
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(es >> (8 * i)));
  const std::uint64_t n = nbytes / es;
  const std::uint64_t chunks = n == 0 ? 0 : (n - 1) / kSparseChunkElements + 1;
  put64(out, nbytes);
  put64(out, kSparseChunkElements);
  put64(out, chunks);
  std::size_t i = 0;
  for (std::uint64_t ch = 0; ch < chunks; ++ch) {
    const std::uint64_t e0 = ch * kSparseChunkElements, e1 = std::min(n, e0 + kSparseChunkElements);
    Bytes gaps;
    std::vector<Bytes> planes(es);
    std::uint64_t next = e0, count = 0;
    // Positions past the end go into the last chunk (to build hostile entries).
    for (; i < elems.size() && (elems[i] < e1 || ch + 1 == chunks); ++i, ++count) {
      std::uint64_t v = elems[i] - next;
      while (v >= 0x80) gaps.push_back(static_cast<std::uint8_t>(v | 0x80)), v >>= 7;
      gaps.push_back(static_cast<std::uint8_t>(v));
      next = elems[i] + 1;
      for (std::uint32_t k = 0; k < es; ++k) planes[k].push_back(xors[i * es + k]);
    }
    put64(out, count);
    const Bytes gf = zframe(gaps);
    put64(out, gf.size());
    std::vector<Bytes> pf;
    for (auto& p : planes) pf.push_back(zframe(p));
    for (auto& f : pf) put64(out, f.size());
    out.insert(out.end(), gf.begin(), gf.end());
    for (auto& f : pf) out.insert(out.end(), f.begin(), f.end());
  }
  return out;
}

}  // namespace

TEST_CASE("sparse: round trips on edge cases for 1-, 2-, 4- and 8-byte elements") {
  for (std::size_t es : {1u, 2u, 4u, 8u}) {
    CAPTURE(es);
    for (std::size_t n : {std::size_t(0), es, es * 3, es * 1001, es * 65537}) {
      CAPTURE(n);
      const Bytes a = random_bytes(n, 7);
      SUBCASE("no change") { CHECK((patched(a, encode(a, a, es)) == a)); }
      SUBCASE("every element changed") {
        Bytes b = a;
        for (auto& x : b) x = static_cast<std::uint8_t>(~x);
        CHECK((patched(a, encode(a, b, es)) == b));
      }
      SUBCASE("only the last byte") {
        if (n == 0) continue;
        Bytes b = a;
        b.back() ^= 0x80;
        CHECK((patched(a, encode(a, b, es)) == b));
      }
      SUBCASE("sparse random changes") {
        Bytes b = a;
        std::mt19937 rng(11);
        for (std::size_t i = 0; i < n / 50; ++i) b[rng() % n] ^= static_cast<std::uint8_t>(1 + rng() % 255);
        CHECK((patched(a, encode(a, b, es)) == b));
      }
    }
  }
}

TEST_CASE("sparse: odd byte lengths fall back to 1-byte elements") {
  const Bytes a = random_bytes(1001, 3);
  Bytes b = a;
  b[1000] ^= 1;
  b[3] ^= 0x40;
  const Bytes e = encode(a, b, 2);  // 1001 is not a multiple of 2
  CHECK((patched(a, e) == b));
  std::uint32_t es;
  std::memcpy(&es, e.data() + 4, 4);
  CHECK(es == 1);
}

TEST_CASE("sparse: several chunks, changes on chunk borders") {
  const std::size_t n = 2 * (kSparseChunkElements * 2) + 6;  // bf16-like: two full chunks and a tail
  Bytes a(n, 0x3c), b = a;
  for (std::size_t e : {std::size_t(0), kSparseChunkElements - 1, kSparseChunkElements, 2 * kSparseChunkElements + 2})
    b[2 * e + 1] ^= 0x01;
  const Bytes e = encode(a, b, 2);
  CHECK((patched(a, e) == b));
}

TEST_CASE("sparse: a position past 4 GiB decodes without allocating the tensor") {
  const std::uint64_t nbytes = (5ull << 30) + 8;  // 5 GiB of 8-byte elements
  const std::uint64_t elem = (4ull << 30) / 8 + 123;  // element at byte 4 GiB + 984
  Bytes x(8, 0);
  x[0] = 0xaa;
  x[7] = 0x01;
  const Bytes entry = handmade(8, nbytes, {3, elem}, Bytes{1, 0, 0, 0, 0, 0, 0, 0, 0xaa, 0, 0, 0, 0, 0, 0, 1});
  std::vector<std::uint64_t> seen;
  std::vector<std::uint8_t> first_bytes;
  decode_sparse(entry, nbytes, "test", [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> xs, std::size_t es, SparseOp) {
    CHECK(es == 8);
    for (std::size_t i = 0; i < offs.size(); ++i) seen.push_back(offs[i]), first_bytes.push_back(xs[i * es]);
  });
  REQUIRE(first_bytes.size() == 2);
  CHECK(first_bytes[1] == 0xaa);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == 24);
  CHECK(seen[1] == elem * 8);
  CHECK(seen[1] > (4ull << 30));
}

TEST_CASE("sparse: hostile entries are refused as malformed input") {
  const Bytes a = random_bytes(4096, 5);
  Bytes b = a;
  b[100] ^= 1;
  b[4000] ^= 2;
  const Bytes good = encode(a, b, 2);
  auto refused = [&](const Bytes& e, std::uint64_t nbytes) {
    return error_code([&] { decode_sparse(e, nbytes, "test", [](auto, auto, auto, auto) {}); }) == Exit::bad_input;
  };
  CHECK(refused(good, 4098));  // another tensor size
  for (std::size_t cut : {std::size_t(0), std::size_t(3), std::size_t(31), std::size_t(40), good.size() - 1})
    CHECK(refused(Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut)), 4096));
  Bytes extra = good;
  extra.push_back(0);
  CHECK(refused(extra, 4096));
  Bytes magic = good;
  magic[0] = 'X';
  CHECK(refused(magic, 4096));
  Bytes es3 = good;
  es3[4] = 3;
  CHECK(refused(es3, 4096));
  Bytes chunks = good;
  chunks[24] = 7;  // chunk count
  CHECK(refused(chunks, 4096));
  // Hand-built: a position outside the tensor, a gap list shorter than K,
  // planes of the wrong length.
  CHECK(refused(handmade(2, 64, {40}, Bytes{1, 1}), 64));
  Bytes short_gaps = handmade(1, 64, {1, 2}, Bytes{1, 1});
  short_gaps[32] = 3;  // K = 3 with only two positions
  CHECK(refused(short_gaps, 64));
  int flipped_refused = 0, flipped_total = 0;
  for (std::size_t i = 0; i < good.size(); ++i) {  // a bit flip anywhere: refused or harmless, never out of range
    Bytes f = good;
    f[i] ^= 0x10;
    ++flipped_total;
    const auto code = error_code([&] {
      decode_sparse(f, 4096, "test", [](std::span<const std::uint64_t> offs, std::span<const std::uint8_t>, std::size_t es, SparseOp) {
        for (auto o : offs) REQUIRE(o + es <= 4096);
      });
    });
    if (code) {
      CHECK(*code == Exit::bad_input);
      ++flipped_refused;
    }
  }
  CHECK(flipped_refused > flipped_total / 2);
}

TEST_CASE("sparse and auto deltas apply end to end, and auto is never larger than xor") {
  char tmpl[] = "/tmp/hfdelta-sparse-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  const fs::path dir = tmpl;
  // Three tensors: sparse bf16 changes, a fully changed f32 tensor, an unchanged one.
  std::mt19937 rng(9);
  auto write = [&](const fs::path& d, const std::vector<Bytes>& data) {
    fs::create_directories(d);
    const auto L = layout_safetensors({{"w.bf16", "BF16", {256, 64}, 256 * 64 * 2},
                                       {"w.f32", "F32", {1000}, 4000},
                                       {"w.same", "U8", {77}, 77}},
                                      nullptr);
    Bytes file(L.prefix.begin(), L.prefix.end());
    file.resize(L.file_size);
    for (const auto& t : L.tensors) {
      const Bytes& src = t.name == "w.bf16" ? data[0] : t.name == "w.f32" ? data[1] : data[2];
      std::memcpy(file.data() + L.prefix.size() + t.begin, src.data(), src.size());
    }
    File f(d / "model.safetensors", File::Mode::create_exclusive);
    f.write_all(file.data(), file.size());
    f.close();
  };
  std::vector<Bytes> v0{random_bytes(256 * 64 * 2, 1), random_bytes(4000, 2), random_bytes(77, 3)};
  std::vector<Bytes> v1 = v0;
  for (int i = 0; i < 200; ++i) v1[0][2 * (rng() % (256 * 64))] ^= 1;
  for (auto& x : v1[1]) x = static_cast<std::uint8_t>(rng());
  write(dir / "s0", v0);
  write(dir / "s1", v1);

  std::map<std::string, std::uint64_t> sizes;
  for (const char* mode : {"xor", "sparse", "auto"}) {
    CAPTURE(mode);
    DiffOptions o;
    o.encoding = std::string(mode) == "auto" ? std::nullopt : parse_encoding(mode);
    o.version = 1;
    o.base_version = 0;
    o.sync = false;
    const fs::path out = dir / (std::string("d_") + mode);
    const DiffSummary s = diff_checkpoints(dir / "s0", dir / "s1", out, o);
    CHECK(s.tensors_changed == 2);
    const DeltaIndex idx = read_delta_index(out);
    CHECK(idx.per_tensor == (std::string(mode) == "auto"));
    for (const auto& [name, file] : idx.weight_map) {
      const auto h = read_safetensors(out / file);
      sizes[std::string(mode) + ":" + name] = h.find(name)->nbytes();
    }
    ApplyOptions ao;
    ao.sync = false;
    const fs::path local = dir / (std::string("L_") + mode);
    init_local(dir / "s0", local, 0, ao);
    apply_delta(out, local, ao);
    CHECK(same_contents(local / "model.safetensors", dir / "s1" / "model.safetensors"));
  }
  for (const char* t : {"w.bf16", "w.f32"}) {
    CAPTURE(t);
    CHECK(sizes[std::string("auto:") + t] <= sizes[std::string("xor:") + t]);
  }
  CHECK(sizes["sparse:w.bf16"] < sizes["xor:w.bf16"]);
  fs::remove_all(dir);
}

TEST_CASE("sparse: index records per-tensor encodings for auto and refuses what it cannot apply") {
  DeltaIndex d;
  d.version = 2;
  d.base_version = 1;
  d.per_tensor = true;
  d.weight_map = {{"a", "model-00000-of-00001.safetensors"}, {"b", "model-00000-of-00001.safetensors"}};
  d.encodings = {{"a", Encoding::sparse}, {"b", Encoding::xor_bytes}};
  const std::string text = write_delta_index_json(d, 10);
  const DeltaIndex r = parse_delta_index(text, "idx");
  CHECK(r.per_tensor);
  CHECK(encoding_of(r, "a") == Encoding::sparse);
  CHECK(encoding_of(r, "b") == Encoding::xor_bytes);
  CHECK(text.find("\"hfdelta_format\": 2") != std::string::npos);
  CHECK(text.find("\"delta_encoding\": \"auto\"") != std::string::npos);

  DeltaIndex plain = d;
  plain.per_tensor = false;
  plain.encoding = Encoding::xor_bytes;
  CHECK(write_delta_index_json(plain, 10).find("\"hfdelta_format\": 1") != std::string::npos);

  auto code = [](const std::string& t) { return error_code([&] { parse_delta_index(t, "idx"); }); };
  std::string no_map = text;
  no_map.replace(no_map.find("\"hfdelta_encodings\""), 19, "\"hfdelta_encodingz\"");
  CHECK(code(seal_delta_index(no_map)) == Exit::bad_input);
  CHECK(code(no_map) == Exit::bad_input);  // unsealed: refused by the index checksum
  std::string unknown = text;
  unknown.replace(unknown.find("\"sparse\""), 8, "\"planes\"");
  CHECK(code(seal_delta_index(unknown)) == Exit::unsupported);
  DeltaIndex missing = d;
  missing.encodings.erase("b");
  CHECK(code(write_delta_index_json(missing, 10)) == Exit::bad_input);
}

TEST_CASE("hostile: chunk tables that wrap around, legacy zstd frames, JSON nested without bound") {
  // A chunk size near 2^64 made the chunk count wrap to 0 (no changes accepted).
  Bytes wrap{'H', 'F', 'S', '1', 1, 0, 0, 0};
  put64(wrap, 5);
  put64(wrap, ~0ull);
  put64(wrap, 0);
  CHECK(error_code([&] { decode_sparse(wrap, 5, "t", [](auto, auto, auto, auto) {}); }) == Exit::bad_input);
  // A truncated pre-1.0 zstd frame, which libzstd's streaming decoder takes as empty.
  const Bytes legacy{0x27, 0xb5, 0x2f, 0xfd, 0x24, 0, 0, 0, 0};
  Decompressor d;
  CHECK(error_code([&] { decode_xor(d, legacy, 0, "t", [](auto, auto) {}); }) == Exit::bad_input);
  // Deeply nested JSON in a header or an index: refused, not a stack overflow.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string header = "{\"a\":{\"dtype\":\"U8\",\"shape\":" + deep + ",\"data_offsets\":[0,0]}}";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  file += header;
  CHECK(error_code([&] { parse_safetensors(file, file.size(), "deep.safetensors"); }) == Exit::bad_input);
  const std::string index = "{\"metadata\":{\"delta_encoding\":\"xor\",\"compression_format\":" + deep + "},\"weight_map\":{}}";
  CHECK(error_code([&] { parse_delta_index(index, "deep index"); }) == Exit::bad_input);
}
