// The sparse encoding and per-tensor "auto" choice: round trips on edge cases,
// positions past 4 GiB, hostile entries, and auto never larger than xor.
// HFS2 (zigzag differences): exact stored values, gaps, every mask offset;
// HFS1 (XOR) entries still read; diff's split of large tensors over threads.
#include <doctest/doctest.h>

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include <zstd.h>
#include <boost/filesystem.hpp>

#include "codec/codec.hpp"
#include "delta/delta_format_internal.hpp"
#include "hfdelta/apply.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/diff.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/safetensors.hpp"
#include "unit_util.hpp"
#include "util/io.hpp"

using namespace hfdelta;
namespace fs = boost::filesystem;
using Bytes = std::vector<std::uint8_t>;

namespace {

Bytes encode(const Bytes& a, const Bytes& b, std::size_t es) {
  Compressor c(3);
  Bytes out;
  const std::uint64_t n =
      encode_sparse(c, a, b, es, [&](std::span<const std::uint8_t> s) { out.insert(out.end(), s.begin(), s.end()); });
  CHECK(n == out.size());
  return out;
}

// Applies a sparse entry to a copy of `a`, checking what the decoder hands out.
Bytes patched(const Bytes& a, const Bytes& entry) {
  Bytes r = a;
  std::uint64_t last = 0;
  bool first = true;
  decode_sparse(entry, a.size(), "test",
                [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> x, std::size_t es, SparseOp op) {
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
  const std::uint64_t nbytes = (5ull << 30) + 8;      // 5 GiB of 8-byte elements
  const std::uint64_t elem = (4ull << 30) / 8 + 123;  // element at byte 4 GiB + 984
  Bytes x(8, 0);
  x[0] = 0xaa;
  x[7] = 0x01;
  const Bytes entry = handmade(8, nbytes, {3, elem}, Bytes{1, 0, 0, 0, 0, 0, 0, 0, 0xaa, 0, 0, 0, 0, 0, 0, 1});
  std::vector<std::uint64_t> seen;
  std::vector<std::uint8_t> first_bytes;
  decode_sparse(entry, nbytes, "test",
                [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> xs, std::size_t es, SparseOp) {
                  CHECK(es == 8);
                  for (std::size_t i = 0; i < offs.size(); ++i)
                    seen.push_back(offs[i]), first_bytes.push_back(xs[i * es]);
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
      decode_sparse(f, 4096, "test",
                    [](std::span<const std::uint64_t> offs, std::span<const std::uint8_t>, std::size_t es, SparseOp) {
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
    const auto L = layout_safetensors(
        {{"w.bf16", "BF16", {256, 64}, 256 * 64 * 2}, {"w.f32", "F32", {1000}, 4000}, {"w.same", "U8", {77}, 77}},
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
  // bf16 weights stepped by one to three units in the last place, as a
  // training step moves them (XOR masks of such steps carry borrows and carries).
  for (int i = 0; i < 200; ++i) {
    std::uint8_t* e = v1[0].data() + 2 * (rng() % (256 * 64));
    const int step = static_cast<int>(1 + rng() % 3) * (rng() % 2 ? 1 : -1);
    const auto u = static_cast<std::uint16_t>((e[0] | e[1] << 8) + step);
    e[0] = static_cast<std::uint8_t>(u), e[1] = static_cast<std::uint8_t>(u >> 8);
  }
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
  const std::string index =
      "{\"metadata\":{\"delta_encoding\":\"xor\",\"compression_format\":" + deep + "},\"weight_map\":{}}";
  CHECK(error_code([&] { parse_delta_index(index, "deep index"); }) == Exit::bad_input);
}

// ---- HFS2: values are zigzag(new - old) ------------------------------------------

namespace {

// An element's bytes as a little-endian unsigned integer.
std::uint64_t load_le(const std::uint8_t* p, std::size_t es) {
  std::uint64_t v = 0;
  for (std::size_t k = es; k-- > 0;) v = v << 8 | p[k];
  return v;
}

void store_le(std::uint8_t* p, std::uint64_t v, std::size_t es) {
  for (std::size_t k = 0; k < es; ++k) p[k] = static_cast<std::uint8_t>(v >> (8 * k));
}

// zigzag(new - old) within es bytes, the long way round (not the shift-xor
// the codec uses): the difference read as a signed w-bit number d, then 2d
// for d >= 0 and -2d-1 (= 2 * ~d + 1 within w bits) for d < 0.
std::uint64_t ref_zigzag(std::uint64_t old_v, std::uint64_t new_v, std::size_t es) {
  const std::uint64_t mask = es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
  const std::uint64_t d = (new_v - old_v) & mask;
  const bool negative = (d >> (8 * es - 1)) & 1;
  return negative ? 2 * (~d & mask) + 1 : 2 * d;
}

// Everything decode_sparse hands out, batches joined.
struct Decoded {
  std::size_t es = 0;
  std::vector<std::uint64_t> offs;
  Bytes values;
  std::set<SparseOp> ops;
};

Decoded decode_all(const Bytes& entry, std::uint64_t nbytes) {
  Decoded d;
  decode_sparse(entry, nbytes, "test",
                [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> v, std::size_t es, SparseOp op) {
                  REQUIRE((d.es == 0 || d.es == es));
                  d.es = es;
                  d.ops.insert(op);
                  d.offs.insert(d.offs.end(), offs.begin(), offs.end());
                  d.values.insert(d.values.end(), v.begin(), v.end());
                });
  return d;
}

std::string magic_of(const Bytes& entry) {
  REQUIRE(entry.size() >= 4);
  return std::string(entry.begin(), entry.begin() + 4);
}

// One chunk of an entry read by the documented layout with zstd's one-shot
// API, without decode_sparse: K, the decoded gaps and the decoded planes.
struct RawChunk {
  std::uint64_t count = 0;
  Bytes gaps;
  std::vector<Bytes> planes;
};

std::uint64_t get64(const Bytes& v, std::size_t at) { return load_le(v.data() + at, 8); }

Bytes unzstd(const std::uint8_t* p, std::size_t n) {
  const unsigned long long size = ZSTD_getFrameContentSize(p, n);
  REQUIRE(size != ZSTD_CONTENTSIZE_ERROR);
  REQUIRE(size != ZSTD_CONTENTSIZE_UNKNOWN);  // the encoder pledges every frame's size
  Bytes out(static_cast<std::size_t>(size));
  const std::size_t r = ZSTD_decompress(out.data(), out.size(), p, n);
  REQUIRE(!ZSTD_isError(r));
  REQUIRE(r == out.size());
  return out;
}

std::vector<RawChunk> raw_chunks(const Bytes& e) {
  REQUIRE(e.size() >= kSparseHeadSize);
  const std::size_t es = static_cast<std::size_t>(load_le(e.data() + 4, 4));
  const std::uint64_t chunks = get64(e, 24);
  std::vector<RawChunk> out;
  std::size_t at = kSparseHeadSize;
  for (std::uint64_t ch = 0; ch < chunks; ++ch) {
    REQUIRE(at + 16 + 8 * es <= e.size());
    RawChunk c;
    c.count = get64(e, at);
    std::vector<std::size_t> lens{static_cast<std::size_t>(get64(e, at + 8))};
    for (std::size_t k = 0; k < es; ++k) lens.push_back(static_cast<std::size_t>(get64(e, at + 16 + 8 * k)));
    at += 16 + 8 * es;
    for (std::size_t f = 0; f < lens.size(); ++f) {
      REQUIRE(lens[f] <= e.size() - at);
      Bytes body = unzstd(e.data() + at, lens[f]);
      at += lens[f];
      if (f == 0)
        c.gaps = std::move(body);
      else
        c.planes.push_back(std::move(body));
    }
    out.push_back(std::move(c));
  }
  CHECK(at == e.size());
  return out;
}

// The entry's changed elements and stored values must be exactly the
// elements that differ between `a` and `b` and zigzag(new - old) of each (a
// round trip alone would not notice an unchanged element stored with value
// 0), and applying it must give `b`.
void check_hfs2(const Bytes& a, const Bytes& b, std::size_t dtype_size) {
  const Bytes e = encode(a, b, dtype_size);
  REQUIRE(magic_of(e) == "HFS2");
  const std::size_t es = sparse_elem_size(dtype_size, b.size());
  CHECK(load_le(e.data() + 4, 4) == es);
  const Decoded d = decode_all(e, b.size());
  std::vector<std::uint64_t> want;
  for (std::size_t off = 0; off < b.size(); off += es)
    if (std::memcmp(a.data() + off, b.data() + off, es) != 0) want.push_back(off);
  REQUIRE(d.offs.size() == want.size());
  CHECK((d.offs == want));
  if (!want.empty()) {
    CHECK(d.es == es);
    CHECK((d.ops == std::set<SparseOp>{SparseOp::add_zigzag}));
  }
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    wrong += load_le(d.values.data() + i * es, es) !=
             ref_zigzag(load_le(a.data() + want[i], es), load_le(b.data() + want[i], es), es);
  CHECK(wrong == 0);
  CHECK((patched(a, e) == b));
}

struct ValueCase {
  std::uint64_t old_v, new_v, stored;
};

// Tensors of `es`-byte elements: case i is element 2i, element 2i+1 is left
// as it is (so every gap is 1 after the first). Checks the raw planes and
// gaps and what the decoder hands out.
void check_stored_values(std::size_t es, const std::vector<ValueCase>& cases) {
  CAPTURE(es);
  Bytes a(2 * cases.size() * es, 0x5a), b = a;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    store_le(a.data() + 2 * i * es, cases[i].old_v, es);
    store_le(b.data() + 2 * i * es, cases[i].new_v, es);
  }
  const Bytes e = encode(a, b, es);
  REQUIRE(magic_of(e) == "HFS2");
  const auto chunks = raw_chunks(e);
  REQUIRE(chunks.size() == 1);
  REQUIRE(chunks[0].count == cases.size());
  Bytes gaps(cases.size(), 1);
  gaps[0] = 0;
  CHECK((chunks[0].gaps == gaps));
  REQUIRE(chunks[0].planes.size() == es);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(i);
    CAPTURE(cases[i].old_v);
    CAPTURE(cases[i].new_v);
    std::uint64_t stored = 0;
    for (std::size_t k = 0; k < es; ++k) stored |= std::uint64_t(chunks[0].planes[k][i]) << (8 * k);  // plane k: byte k
    CHECK(stored == cases[i].stored);
    CHECK(ref_zigzag(cases[i].old_v, cases[i].new_v, es) == cases[i].stored);  // the table itself
  }
  const Decoded d = decode_all(e, a.size());
  CHECK((d.ops == std::set<SparseOp>{SparseOp::add_zigzag}));
  REQUIRE(d.offs.size() == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CHECK(d.offs[i] == 2 * i * es);
    CHECK(load_le(d.values.data() + i * es, es) == cases[i].stored);
  }
  CHECK((patched(a, e) == b));
}

}  // namespace

TEST_CASE("sparse HFS2: exact stored values, wrap-around at the maximum included") {
  // A one-ulp step is 2 (up) or 1 (down) whatever carries it causes; the
  // most negative difference is the largest value.
  check_stored_values(1, {{0x00, 0x01, 2},
                          {0x01, 0x00, 1},
                          {0xff, 0x00, 2},
                          {0x00, 0xff, 1},
                          {0x7f, 0x80, 2},
                          {0x80, 0x7f, 1},
                          {0x00, 0x80, 0xff},
                          {0x00, 0x7f, 0xfe},
                          {0x10, 0x0e, 3},
                          {0x3c, 0x3f, 6}});
  check_stored_values(2, {{0x3f80, 0x3f81, 2},
                          {0x3f81, 0x3f80, 1},
                          {0x0000, 0xffff, 1},
                          {0xffff, 0x0000, 2},
                          {0x7fff, 0x8000, 2},
                          {0x8000, 0x7fff, 1},
                          {0x3fff, 0x4000, 2},
                          {0x0000, 0x8000, 0xffff},
                          {0x0000, 0x7fff, 0xfffe},
                          {0x4000, 0x3f80, 0xff}});
  check_stored_values(4, {{0x3f800000, 0x3f800001, 2},
                          {0x3f800000, 0x3f7fffff, 1},
                          {0xffffffff, 0, 2},
                          {0, 0xffffffff, 1},
                          {0x7fffffff, 0x80000000, 2},
                          {0, 0x80000000, 0xffffffff},
                          {0x00ffffff, 0x01000000, 2},
                          {100, 90, 19}});
  check_stored_values(8, {{~0ull, 0, 2},
                          {0, ~0ull, 1},
                          {0x7fffffffffffffffull, 0x8000000000000000ull, 2},
                          {0, 0x8000000000000000ull, ~0ull},
                          {0, 0x7fffffffffffffffull, 0xfffffffffffffffeull},
                          {0x3ff0000000000000ull, 0x3ff0000000000003ull, 6},
                          {0x00ffffffffffffffull, 0x0100000000000000ull, 2},
                          {5, 2, 5}});
}

TEST_CASE("sparse HFS2: the bf16 step 0x3f80 -> 0x3f81 stores 2 in plane 0 and 0 in plane 1") {
  // The case from the format's description, on its own: one element.
  const Bytes a{0x80, 0x3f}, b{0x81, 0x3f};
  const Bytes e = encode(a, b, 2);
  CHECK(magic_of(e) == "HFS2");
  const auto chunks = raw_chunks(e);
  REQUIRE(chunks.size() == 1);
  CHECK(chunks[0].count == 1);
  CHECK((chunks[0].gaps == Bytes{0}));
  REQUIRE(chunks[0].planes.size() == 2);
  CHECK((chunks[0].planes[0] == Bytes{2}));
  CHECK((chunks[0].planes[1] == Bytes{0}));
  // 0x0000 -> 0xffff is a step down by one: 1, where XOR would store 0xffff.
  const auto down = raw_chunks(encode(Bytes{0, 0}, Bytes{0xff, 0xff}, 2));
  REQUIRE(down.size() == 1);
  REQUIRE(down[0].planes.size() == 2);
  CHECK((down[0].planes[0] == Bytes{1}));
  CHECK((down[0].planes[1] == Bytes{0}));
}

TEST_CASE("sparse HFS2: gaps of 1, 2 and 3 varint bytes, up to the last element of a chunk") {
  // The encoder writes varints without branches; each width and its borders.
  const std::size_t n = kSparseChunkElements;  // one full chunk of bf16
  Bytes a(2 * n, 0x11), b = a;
  const std::vector<std::size_t> elems{0, 1, 129, 258, 16642, 33027, n - 1};  // gaps 0, 0, 127, 128, 16383, 16384, rest
  for (std::size_t e : elems) b[2 * e] ^= 0x04;
  const auto chunks = raw_chunks(encode(a, b, 2));
  REQUIRE(chunks.size() == 1);
  CHECK(chunks[0].count == elems.size());
  const std::uint64_t last_gap = (n - 1) - 33028;  // 1015547 = 0x0f7efb
  const Bytes want{0x00,
                   0x00,
                   0x7f,
                   0x80,
                   0x01,
                   0xff,
                   0x7f,
                   0x80,
                   0x80,
                   0x01,
                   static_cast<std::uint8_t>(0x80 | (last_gap & 0x7f)),
                   static_cast<std::uint8_t>(0x80 | ((last_gap >> 7) & 0x7f)),
                   static_cast<std::uint8_t>(last_gap >> 14)};
  CHECK((chunks[0].gaps == want));
  CHECK((patched(a, encode(a, b, 2)) == b));

  // The largest gap there is: only the chunk's last element changed. The
  // next chunk counts its gaps from its own start.
  Bytes c(2 * (n + 5), 0x22), d = c;
  d[2 * (n - 1) + 1] ^= 0x80;
  d[2 * n] ^= 0x01;
  const auto two = raw_chunks(encode(c, d, 2));
  REQUIRE(two.size() == 2);
  CHECK((two[0].gaps == Bytes{0xff, 0xff, 0x3f}));
  CHECK((two[1].gaps == Bytes{0x00}));
  CHECK((patched(c, encode(c, d, 2)) == d));
}

TEST_CASE("sparse HFS2: every pair of 1-byte values") {
  // 65536 elements, old = i & 0xff and new = i >> 8: each stored value is
  // checked against the reference zigzag, the equal pairs must be skipped.
  Bytes a(65536), b(65536);
  for (std::size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<std::uint8_t>(i), b[i] = static_cast<std::uint8_t>(i >> 8);
  check_hfs2(a, b, 1);
}

TEST_CASE("sparse HFS2: round trips with exact values on the edge cases") {
  for (std::size_t es : {1u, 2u, 4u, 8u}) {
    CAPTURE(es);
    for (std::size_t n : {std::size_t(0), es, es * 3, es * 1001, es * 65537}) {
      CAPTURE(n);
      const Bytes a = random_bytes(n, 17);
      SUBCASE("no change") { check_hfs2(a, a, es); }
      SUBCASE("every element changed, random new values") { check_hfs2(a, random_bytes(n, 18), es); }
      SUBCASE("every element changed by one ulp, up and down, carries included") {
        Bytes b = a;
        for (std::size_t off = 0; off < n; off += es)
          store_le(b.data() + off, load_le(a.data() + off, es) + ((off / es) % 2 ? 1 : ~0ull), es);
        check_hfs2(a, b, es);
      }
      SUBCASE("wrap-around: all zero bytes to all 0xff and back") {
        check_hfs2(Bytes(n, 0x00), Bytes(n, 0xff), es);
        check_hfs2(Bytes(n, 0xff), Bytes(n, 0x00), es);
        check_hfs2(Bytes(n, 0x7f), Bytes(n, 0x80), es);  // the largest positive to the most negative in each byte
      }
      SUBCASE("only the last byte") {
        if (n == 0) continue;
        Bytes b = a;
        b.back() ^= 0x80;
        check_hfs2(a, b, es);
      }
      SUBCASE("random elements changed") {
        Bytes b = a;
        std::mt19937 rng(19);
        for (std::size_t i = 0; i < n / 40; ++i) b[rng() % n] = static_cast<std::uint8_t>(rng());
        check_hfs2(a, b, es);
      }
    }
  }
}

TEST_CASE("sparse HFS2: odd byte lengths fall back to 1-byte elements") {
  for (std::size_t dtype_size : {2u, 4u, 8u}) {
    CAPTURE(dtype_size);
    for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(1001), std::size_t(4097)}) {
      CAPTURE(n);
      const Bytes a = random_bytes(n, 23);
      Bytes b = a;
      b[0] = static_cast<std::uint8_t>(b[0] + 1);
      b[n - 1] = static_cast<std::uint8_t>(b[n - 1] - 1);
      const Bytes e = encode(a, b, dtype_size);
      CHECK(load_le(e.data() + 4, 4) == 1);
      check_hfs2(a, b, dtype_size);
      check_hfs2(a, random_bytes(n, 24), dtype_size);
    }
  }
  // 1 is kept for a dtype of 1 byte, 8 for 8 when the length fits.
  CHECK(sparse_elem_size(1, 9) == 1);
  CHECK(sparse_elem_size(8, 16) == 8);
  CHECK(sparse_elem_size(8, 20) == 1);
  CHECK(sparse_elem_size(3, 9) == 1);
}

TEST_CASE("sparse HFS2: several chunks with a partial last one, for 1- and 8-byte elements too") {
  for (std::size_t es : {1u, 2u, 4u, 8u}) {
    CAPTURE(es);
    const std::size_t elems = 2 * kSparseChunkElements + 77;
    const Bytes a = random_bytes(elems * es, 29);
    Bytes b = a;
    std::mt19937_64 rng(31);
    for (std::size_t i = 0; i < elems / 1000; ++i) {
      const std::size_t e = rng() % elems;
      store_le(b.data() + e * es, load_le(a.data() + e * es, es) + rng() % 7 - 3, es);
    }
    // Elements on every chunk border, and the last one.
    for (std::size_t e : {std::size_t(0), kSparseChunkElements - 1, kSparseChunkElements, 2 * kSparseChunkElements - 1,
                          2 * kSparseChunkElements, elems - 1})
      b[e * es + es - 1] ^= 0x40;
    check_hfs2(a, b, es);
    CHECK(raw_chunks(encode(a, b, es)).size() == 3);
  }
  // Every byte of a 3-chunk 1-byte tensor changed.
  const Bytes a = random_bytes(3 * kSparseChunkElements + 1, 37);
  check_hfs2(a, random_bytes(a.size(), 38), 1);
}

TEST_CASE("sparse HFS2: a change at every offset of a 64-byte block is found, and only it") {
  // The encoder compares 64-byte blocks (AVX2 or SSE2/generic, picked at run
  // time) and turns each block's byte mask into element bits; a lane or
  // shift mistake shows as a missed or an extra element at some offset.
  // 5 whole blocks and a 24-byte tail (not a whole block).
  const std::size_t len = 5 * 64 + 24;
  const Bytes a = random_bytes(len, 41);
  for (std::size_t es : {1u, 2u, 4u, 8u}) {
    CAPTURE(es);
    for (std::size_t block : {0u, 2u, 4u}) {
      for (std::size_t o = 0; o < 64; ++o) {
        CAPTURE(block);
        CAPTURE(o);
        Bytes b = a;
        b[64 * block + o] = static_cast<std::uint8_t>(b[64 * block + o] + 1 + o);
        check_hfs2(a, b, es);
      }
    }
    for (std::size_t o = 0; o < 24; ++o) {  // the tail after the last whole block
      CAPTURE(o);
      Bytes b = a;
      b[320 + o] ^= 0xff;
      check_hfs2(a, b, es);
    }
  }
}

TEST_CASE("sparse HFS2: random byte masks over many blocks and unaligned views") {
  // More than one batch of block masks (1024 blocks = 64 KiB), every block
  // with its own random set of changed bytes: none, a few, a quarter, all.
  std::mt19937_64 rng(43);
  const std::size_t len = 64 * 2500 + 40;
  Bytes buf_a = random_bytes(len + 8, 44);
  for (std::size_t es : {1u, 2u, 4u, 8u}) {
    CAPTURE(es);
    Bytes buf_b = buf_a;
    for (std::size_t blk = 0; blk * 64 < len + 8; ++blk) {
      const std::uint64_t r = rng() & rng();
      const std::uint64_t m = blk % 11 == 0 ? 0 : blk % 7 == 0 ? ~0ull : blk % 3 ? r & rng() : r;
      for (std::size_t i = 0; i < 64 && blk * 64 + i < buf_b.size(); ++i)
        if (m >> i & 1) buf_b[blk * 64 + i] = static_cast<std::uint8_t>(buf_b[blk * 64 + i] + 1 + (rng() % 255));
    }
    // Views that start 0..7 bytes into the buffers: the loads must not rely
    // on alignment.
    for (std::size_t shift = 0; shift < 8; ++shift) {
      CAPTURE(shift);
      const Bytes a(buf_a.begin() + shift, buf_a.begin() + shift + len);
      const Bytes b(buf_b.begin() + shift, buf_b.begin() + shift + len);
      check_hfs2(a, b, es);
      // The same through an unaligned span into the original buffers.
      Compressor c(3);
      Bytes e;
      encode_sparse(c, std::span<const std::uint8_t>(buf_a.data() + shift, len),
                    std::span<const std::uint8_t>(buf_b.data() + shift, len), es,
                    [&](std::span<const std::uint8_t> s) { e.insert(e.end(), s.begin(), s.end()); });
      CHECK((e == encode(a, b, es)));
    }
  }
}

TEST_CASE("sparse: a chunk scanned in pieces, as diff does, is the chunk scanned at once") {
  // diff feeds SparseChunkEncoder the blocks that differ, each with the index
  // of its first element in the chunk; the entry must be what encode_sparse
  // writes. One encoder for all element sizes: its buffers grow and are reused.
  SparseChunkEncoder enc;
  Compressor c(3);
  for (std::size_t es : {1u, 8u, 2u, 4u}) {
    CAPTURE(es);
    const std::size_t elems = kSparseChunkElements + 3000;
    const Bytes a = random_bytes(elems * es, 47);
    Bytes b = a;
    std::mt19937 rng(48);
    for (std::size_t i = 0; i < 5000; ++i) b[rng() % b.size()] ^= static_cast<std::uint8_t>(1 + rng() % 255);
    for (std::size_t i = 0; i < 4096; ++i) b[700000 + i] ^= 0x10;  // a dense run, crossing piece borders
    Bytes e(kSparseHeadSize);
    sparse_entry_head(sparse_elem_size(es, b.size()), b.size(), e.data());
    const ByteSink sink = [&](std::span<const std::uint8_t> s) { e.insert(e.end(), s.begin(), s.end()); };
    const std::size_t pieces[] = {1, 63, 64, 4097, 65536, 100};
    std::uint64_t elements = 0, bytes = 0;
    for (std::size_t e0 = 0; e0 < elems; e0 += kSparseChunkElements) {
      const std::size_t e1 = std::min(elems, e0 + kSparseChunkElements);
      enc.begin(es);
      std::size_t p = 0;
      for (std::size_t at = e0; at < e1; ++p) {
        const std::size_t k = std::min(pieces[p % 6], e1 - at);
        if (std::memcmp(a.data() + at * es, b.data() + at * es, k * es) != 0)  // equal pieces are skipped
          enc.scan(a.data() + at * es, b.data() + at * es, k, at - e0);
        at += k;
      }
      elements += enc.changed_elements();
      bytes += enc.changed_bytes();
      enc.end(c, sink);
    }
    CHECK((e == encode(a, b, es)));
    const ChangeCount cc = count_changes(a, b, es);
    CHECK(elements == cc.elements);
    CHECK(bytes == cc.bytes);
  }
}

TEST_CASE("sparse HFS1: entries from before HFS2 still decode, as XOR values") {
  for (std::uint32_t es : {1u, 2u, 4u, 8u}) {
    CAPTURE(es);
    for (std::size_t elems : {std::size_t(1), std::size_t(777), kSparseChunkElements + 9}) {
      CAPTURE(elems);
      const Bytes a = random_bytes(elems * es, 53);
      Bytes b = a;
      std::mt19937 rng(54);
      for (std::size_t i = 0; i < elems / 50 + 1; ++i)
        b[rng() % b.size()] ^= static_cast<std::uint8_t>(1 + rng() % 255);
      b.back() = static_cast<std::uint8_t>(b.back() + 1);  // the last element, with a carry-free step
      std::vector<std::uint64_t> positions;
      Bytes xors;
      for (std::size_t e = 0; e < elems; ++e) {
        if (std::memcmp(a.data() + e * es, b.data() + e * es, es) == 0) continue;
        positions.push_back(e);
        for (std::size_t k = 0; k < es; ++k) xors.push_back(a[e * es + k] ^ b[e * es + k]);
      }
      const Bytes entry = handmade(es, b.size(), positions, xors);
      REQUIRE(magic_of(entry) == "HFS1");
      const Decoded d = decode_all(entry, b.size());
      CHECK((d.ops == std::set<SparseOp>{SparseOp::xor_bytes}));
      CHECK(d.values == xors);
      CHECK((patched(a, entry) == b));
    }
  }
  // The magic alone decides what the values mean: the HFS2 entry of
  // 0x3f80 -> 0x3f81 (value 2) relabelled HFS1 XORs 2 in: 0x3f82.
  Bytes e = encode(Bytes{0x80, 0x3f}, Bytes{0x81, 0x3f}, 2);
  REQUIRE(magic_of(e) == "HFS2");
  e[3] = '1';
  const Decoded d = decode_all(e, 2);
  CHECK((d.ops == std::set<SparseOp>{SparseOp::xor_bytes}));
  CHECK((patched(Bytes{0x80, 0x3f}, e) == Bytes{0x82, 0x3f}));
  // Neither an older nor a newer revision is taken for one of these.
  for (char m : {'0', '3'}) {
    e[3] = m;
    CHECK(error_code([&] { decode_all(e, 2); }) == Exit::bad_input);
  }
}

TEST_CASE("sparse_apply_value: both ops, every element size, nothing outside the element touched") {
  auto applied = [](std::size_t es, std::uint64_t elem, std::uint64_t value, SparseOp op) {
    // The element sits between guard bytes that must stay as they are.
    Bytes buf(es + 16, 0xa5), v(es);
    store_le(buf.data() + 8, elem, es);
    store_le(v.data(), value, es);
    sparse_apply_value(buf.data() + 8, v.data(), es, op);
    for (std::size_t i = 0; i < 8; ++i) {
      CHECK(buf[i] == 0xa5);
      CHECK(buf[8 + es + i] == 0xa5);
    }
    return load_le(buf.data() + 8, es);
  };
  // XOR: bytewise, no carries.
  CHECK(applied(2, 0x3f80, 0x0001, SparseOp::xor_bytes) == 0x3f81);
  CHECK(applied(2, 0x3f81, 0x0001, SparseOp::xor_bytes) == 0x3f80);
  CHECK(applied(1, 0xff, 0xff, SparseOp::xor_bytes) == 0x00);
  CHECK(applied(4, 0x12345678, 0xffffffff, SparseOp::xor_bytes) == 0xedcba987);
  CHECK(applied(8, 0x0123456789abcdefull, 0x8000000000000001ull, SparseOp::xor_bytes) == 0x8123456789abcdeeull);
  // zigzag: even values add value/2, odd ones subtract (value+1)/2, modulo 2^(8 es).
  CHECK(applied(2, 0x3f80, 2, SparseOp::add_zigzag) == 0x3f81);
  CHECK(applied(2, 0x3f80, 1, SparseOp::add_zigzag) == 0x3f7f);
  CHECK(applied(2, 0x3fff, 2, SparseOp::add_zigzag) == 0x4000);  // carry into the high byte
  CHECK(applied(2, 0xffff, 2, SparseOp::add_zigzag) == 0x0000);  // wraps, does not spill past the element
  CHECK(applied(2, 0x0000, 1, SparseOp::add_zigzag) == 0xffff);
  CHECK(applied(2, 0x1234, 0, SparseOp::add_zigzag) == 0x1234);
  CHECK(applied(1, 0x80, 0xff, SparseOp::add_zigzag) == 0x00);  // -128
  CHECK(applied(1, 0x80, 0xfe, SparseOp::add_zigzag) == 0xff);  // +127
  CHECK(applied(4, 0xffffffff, 2, SparseOp::add_zigzag) == 0);
  CHECK(applied(4, 0x80000000, 1, SparseOp::add_zigzag) == 0x7fffffff);
  CHECK(applied(4, 0, 0xffffffff, SparseOp::add_zigzag) == 0x80000000);
  CHECK(applied(8, ~0ull, 2, SparseOp::add_zigzag) == 0);
  CHECK(applied(8, 0, 1, SparseOp::add_zigzag) == ~0ull);
  CHECK(applied(8, 0, ~0ull, SparseOp::add_zigzag) == 0x8000000000000000ull);
  CHECK(applied(8, 0, 0xfffffffffffffffeull, SparseOp::add_zigzag) == 0x7fffffffffffffffull);
  // Against the reference zigzag, for random pairs: stored value in, new element out.
  std::mt19937_64 rng(59);
  for (std::size_t es : {1u, 2u, 4u, 8u})
    for (int i = 0; i < 2000; ++i) {
      const std::uint64_t mask = es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
      const std::uint64_t x = rng() & mask, y = rng() & mask;
      CHECK(applied(es, x, ref_zigzag(x, y, es), SparseOp::add_zigzag) == y);
      CHECK(applied(es, x, x ^ y, SparseOp::xor_bytes) == y);
    }
}

// ---- diff: the split path, and auto against xor per tensor -------------------------

namespace {

struct TensorData {
  std::string name, dtype;
  std::vector<std::uint64_t> shape;
  Bytes data;
};

void write_checkpoint(const fs::path& d, const std::vector<TensorData>& ts) {
  fs::create_directories(d);
  std::vector<TensorSpec> specs;
  for (const auto& t : ts) specs.push_back({t.name, t.dtype, t.shape, t.data.size()});
  const auto L = layout_safetensors(specs, nullptr);
  Bytes file(L.prefix.begin(), L.prefix.end());
  file.resize(L.file_size);
  for (const auto& info : L.tensors)
    for (const auto& t : ts)
      if (t.name == info.name) std::memcpy(file.data() + L.prefix.size() + info.begin, t.data.data(), t.data.size());
  File f(d / "model.safetensors", File::Mode::create_exclusive);
  f.write_all(file.data(), file.size());
  f.close();
}

fs::path diff_to(const fs::path& base, const fs::path& target, const fs::path& out, std::optional<Encoding> enc,
                 int threads) {
  DiffOptions o;
  o.encoding = enc;
  o.version = 1;
  o.base_version = 0;
  o.threads = threads;
  o.sync = false;
  diff_checkpoints(base, target, out, o);
  return out;
}

// Every file of a directory tree: relative path -> contents.
std::map<std::string, Bytes> tree(const fs::path& dir) {
  std::map<std::string, Bytes> out;
  for (fs::recursive_directory_iterator it(dir), end; it != end; ++it) {
    if (!fs::is_regular_file(it->symlink_status())) continue;
    const MappedFile m(it->path());
    const auto b = m.bytes();
    out[fs::relative(it->path(), dir).string()] = Bytes(b.begin(), b.end());
  }
  return out;
}

// The U8 entry length of each changed tensor, from the delta's shard headers.
std::map<std::string, std::uint64_t> entry_sizes(const fs::path& delta) {
  std::map<std::string, std::uint64_t> out;
  const DeltaIndex idx = read_delta_index(delta);
  for (const auto& [name, file] : idx.weight_map) {
    const auto h = read_safetensors(delta / file);
    const TensorInfo* t = h.find(name);
    REQUIRE(t != nullptr);
    CHECK(t->dtype == "U8");
    out[name] = t->nbytes();
  }
  return out;
}

void check_applies(const fs::path& base, const fs::path& delta, const fs::path& target, const fs::path& local) {
  ApplyOptions ao;
  ao.sync = false;
  init_local(base, local, 0, ao);
  apply_delta(delta, local, ao);
  CHECK(same_contents(local / "model.safetensors", target / "model.safetensors"));
}

// `data` with every byte XORed by a short repeating pattern: every byte
// changes, yet the XOR stream is nearly free to compress (xor wins).
Bytes xor_pattern(Bytes data) {
  static const std::uint8_t pat[7] = {0x01, 0x80, 0x11, 0x42, 0x07, 0x99, 0x23};
  for (std::size_t i = 0; i < data.size(); ++i) data[i] ^= pat[i % 7];
  return data;
}

// bf16-like weights: random low bytes, high bytes near 0x3c.
Bytes bf16_weights(std::size_t elems, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes v(2 * elems);
  for (std::size_t i = 0; i < elems; ++i)
    v[2 * i] = static_cast<std::uint8_t>(rng()), v[2 * i + 1] = static_cast<std::uint8_t>(0x3c + rng() % 3);
  return v;
}

// `data` (es-byte elements) with about one element in `every` stepped by +-1..2 ulp.
Bytes ulp_steps(Bytes data, std::size_t es, std::size_t every, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (std::size_t off = 0; off < data.size(); off += es)
    if (rng() % every == 0)
      store_le(data.data() + off, load_le(data.data() + off, es) + (rng() % 2 ? 1 + rng() % 2 : ~0ull - rng() % 2), es);
  return data;
}

}  // namespace

TEST_CASE("diff: a tensor split into chunk ranges over threads gives the same delta as one thread") {
  // A tensor is cut into ranges of chunks when threads > 1, it has at least
  // 2 chunks, and it is more than total / (2 threads) bytes: the three large
  // tensors here are, for 2, 3 and 4 threads. The output must not depend on
  // the thread count.
  unit::TempDir tmp;
  const fs::path dir = tmp.path();
  const std::size_t big = 3 * kSparseChunkElements + 1024;  // 4 chunks, the last partial
  const Bytes big0 = bf16_weights(big, 61);
  Bytes big1 = ulp_steps(big0, 2, 300, 62);
  // Chunk 1 unchanged (its range has an empty chunk), chunk 2 changed
  // throughout, changes on the chunk borders and in the last element.
  std::memcpy(big1.data() + 2 * kSparseChunkElements, big0.data() + 2 * kSparseChunkElements, 2 * kSparseChunkElements);
  for (std::size_t e = 2 * kSparseChunkElements; e < 3 * kSparseChunkElements; ++e)
    store_le(big1.data() + 2 * e, load_le(big0.data() + 2 * e, 2) + 1, 2);
  for (std::size_t e : {kSparseChunkElements - 1, 3 * kSparseChunkElements, big - 1}) big1[2 * e] ^= 0x01;
  // A second large tensor that auto encodes as xor (every byte changes in a
  // repeating pattern), so the split path's xor choice is covered too.
  const Bytes wide0 = random_bytes(4 * (2 * kSparseChunkElements), 63);
  const Bytes wide1 = xor_pattern(wide0);
  // A third whose first changed block has a few steps and the rest changes
  // in a pattern: auto decides on the tensor's first block with changes,
  // which must be the same block however the tensor is split.
  const Bytes mixed0 = random_bytes(4 * (2 * kSparseChunkElements), 68);
  Bytes mixed1 = xor_pattern(mixed0);
  const Bytes head = ulp_steps(Bytes(mixed0.begin(), mixed0.begin() + 256 * 1024), 4, 100, 69);
  std::copy(head.begin(), head.end(), mixed1.begin());
  const Bytes norm0 = random_bytes(4096, 64), bias0 = bf16_weights(300, 65), mask0 = random_bytes(77, 66);
  Bytes norm1 = ulp_steps(norm0, 4, 10, 67), bias1 = bias0;
  bias1[599] ^= 0x01;
  write_checkpoint(dir / "s0", {{"big.weight", "BF16", {3073, 1024}, big0},
                                {"wide.weight", "F32", {2048, 1024}, wide0},
                                {"mixed.weight", "F32", {2048, 1024}, mixed0},
                                {"norm.weight", "F32", {1024}, norm0},
                                {"bias", "BF16", {300}, bias0},
                                {"mask", "U8", {77}, mask0}});
  write_checkpoint(dir / "s1", {{"big.weight", "BF16", {3073, 1024}, big1},
                                {"wide.weight", "F32", {2048, 1024}, wide1},
                                {"mixed.weight", "F32", {2048, 1024}, mixed1},
                                {"norm.weight", "F32", {1024}, norm1},
                                {"bias", "BF16", {300}, bias1},
                                {"mask", "U8", {77}, mask0}});

  for (const std::optional<Encoding> enc : {std::optional<Encoding>(), std::optional<Encoding>(Encoding::sparse)}) {
    const std::string tag = enc ? "sparse" : "auto";
    CAPTURE(tag);
    const fs::path one = diff_to(dir / "s0", dir / "s1", dir / ("d_" + tag + "_1"), enc, 1);
    const auto want = tree(one);
    const auto sizes = entry_sizes(one);
    CHECK(sizes.size() == 5);  // mask is unchanged
    CHECK(sizes.count("mask") == 0);
    const DeltaIndex idx = read_delta_index(one);
    if (!enc) {
      CHECK(encoding_of(idx, "big.weight") == Encoding::context);
      CHECK(encoding_of(idx, "wide.weight") == Encoding::xor_bytes);
    }
    for (int threads : {2, 3, 4}) {
      CAPTURE(threads);
      const fs::path out =
          diff_to(dir / "s0", dir / "s1", dir / ("d_" + tag + "_" + std::to_string(threads)), enc, threads);
      const auto got = tree(out);
      REQUIRE(got.size() == want.size());
      for (const auto& [file, bytes] : want) {
        const auto& path = file;  // clang 14 cannot capture a structured binding (CAPTURE)
        CAPTURE(path);
        REQUIRE(got.count(path) == 1);
        CHECK((got.at(path) == bytes));
      }
      if (threads == 4) check_applies(dir / "s0", out, dir / "s1", dir / ("L_" + tag));
    }
  }
}

TEST_CASE("auto: every changed tensor's entry is no larger than its xor entry, on several generated pairs") {
  // Each pair is diffed three times (xor, sparse, auto); per tensor, auto is
  // one of the other two, never larger than either: exactly the smaller.
  // The pairs include tensors where xor wins, large and small, and at 3
  // threads tensors cut into ranges (".split": 4 and 7 chunks, over a third
  // of their pair), whose xor entry is estimated by the hash unit's sample.
  struct Pair {
    const char* name;
    std::vector<TensorData> v0, v1;
    std::vector<std::string> want_xor,
        want_sparse;  // what auto must choose, where it is clear (want_sparse: the chunked encoding, context)
  };
  std::vector<Pair> pairs;
  {
    Pair p{"ulp steps", {}, {}, {}, {"bf16.exact", "bf16.sampled", "u8.plus_one", "bf16.split"}};
    const Bytes e0 = bf16_weights(512 * 512, 71), s0 = bf16_weights(1024 * 640, 72), f0 = random_bytes(1200, 73),
                u0 = random_bytes(1000, 74), x0 = bf16_weights(3072 * 1024, 78);
    Bytes u1 = u0;
    for (auto& x : u1) x = static_cast<std::uint8_t>(x + 1);  // zigzag 2 everywhere: sparse is nearly free
    p.v0 = {{"bf16.exact", "BF16", {512, 512}, e0},
            {"bf16.sampled", "BF16", {1024, 640}, s0},
            {"f32.all", "F32", {300}, f0},
            {"u8.plus_one", "U8", {1000}, u0},
            {"bf16.split", "BF16", {3072, 1024}, x0}};
    p.v1 = {{"bf16.exact", "BF16", {512, 512}, ulp_steps(e0, 2, 50, 75)},
            {"bf16.sampled", "BF16", {1024, 640}, ulp_steps(s0, 2, 50, 76)},
            {"f32.all", "F32", {300}, random_bytes(1200, 77)},
            {"u8.plus_one", "U8", {1000}, u1},
            {"bf16.split", "BF16", {3072, 1024}, ulp_steps(x0, 2, 50, 79)}};
    pairs.push_back(std::move(p));
  }
  {
    // f64.few: two changed elements of 100, where the 9 frames of a sparse
    // entry cost more than one xor frame of mostly zeros.
    // f32.mixed: a first block of a few one-ulp steps, then every byte
    // changed in a repeating XOR pattern: a tensor whose start says nothing
    // about the rest (no estimate from a part of it would do).
    Pair p{"xor wins",
           {},
           {},
           {"bf16.pattern", "f32.pattern.large", "u8.pattern", "f64.few", "f32.mixed", "bf16.pattern.split"},
           {}};
    const Bytes b0 = bf16_weights(256 * 256, 81), f0 = random_bytes(4 * 512 * 1024, 82), d0 = random_bytes(800, 83),
                u0 = random_bytes(5000, 84), m0 = random_bytes(4 * 1024 * 1024, 85), x0 = bf16_weights(3072 * 2048, 86);
    Bytes d1 = d0;
    d1[8 * 3] ^= 1, d1[8 * 70 + 7] ^= 0x10;
    Bytes m1 = xor_pattern(m0);
    std::copy(m0.begin(), m0.begin() + 256 * 1024, m1.begin());
    for (std::size_t i = 0; i < 256 * 1024; i += 4096) m1[i] ^= 1;
    p.v0 = {{"bf16.pattern", "BF16", {256, 256}, b0},
            {"f32.pattern.large", "F32", {512, 1024}, f0},
            {"f64.few", "F64", {100}, d0},
            {"u8.pattern", "U8", {5000}, u0},
            {"f32.mixed", "F32", {1024, 1024}, m0},
            {"bf16.pattern.split", "BF16", {3072, 2048}, x0}};
    p.v1 = {{"bf16.pattern", "BF16", {256, 256}, xor_pattern(b0)},
            {"f32.pattern.large", "F32", {512, 1024}, xor_pattern(f0)},
            {"f64.few", "F64", {100}, d1},
            {"u8.pattern", "U8", {5000}, xor_pattern(u0)},
            {"f32.mixed", "F32", {1024, 1024}, m1},
            {"bf16.pattern.split", "BF16", {3072, 2048}, xor_pattern(x0)}};
    pairs.push_back(std::move(p));
  }
  {
    Pair p{"dense random", {}, {}, {}, {}};
    const Bytes b0 = random_bytes(2 * 700 * 512, 91), h0 = random_bytes(66, 92), i0 = random_bytes(8 * 1000, 93);
    p.v0 = {{"bf16.random.large", "BF16", {700, 512}, b0}, {"f16.small", "F16", {33}, h0}, {"i64", "I64", {1000}, i0}};
    p.v1 = {{"bf16.random.large", "BF16", {700, 512}, random_bytes(b0.size(), 94)},
            {"f16.small", "F16", {33}, random_bytes(66, 95)},
            {"i64", "I64", {1000}, ulp_steps(i0, 8, 3, 96)}};
    pairs.push_back(std::move(p));
  }

  unit::TempDir tmp;
  for (std::size_t k = 0; k < pairs.size(); ++k) {
    const Pair& p = pairs[k];
    const std::string pair_name = p.name;
    CAPTURE(pair_name);
    const fs::path dir = tmp.path() / std::to_string(k);
    write_checkpoint(dir / "s0", p.v0);
    write_checkpoint(dir / "s1", p.v1);
    std::map<std::string, std::map<std::string, std::uint64_t>> sizes;  // mode -> tensor -> entry size
    for (const char* mode : {"xor", "context", "auto"}) {
      const std::optional<Encoding> enc = std::string(mode) == "auto" ? std::nullopt : parse_encoding(mode);
      diff_to(dir / "s0", dir / "s1", dir / mode, enc, 3);
      sizes[mode] = entry_sizes(dir / mode);
    }
    REQUIRE(sizes["auto"].size() == p.v0.size());  // every tensor changed in these pairs
    REQUIRE(sizes["xor"].size() == p.v0.size());
    REQUIRE(sizes["context"].size() == p.v0.size());
    const DeltaIndex idx = read_delta_index(dir / "auto");
    for (const auto& t : p.v0) {
      CAPTURE(t.name);
      // auto keeps the smaller of context and xor
      const std::uint64_t a = sizes["auto"][t.name], x = sizes["xor"][t.name], s = sizes["context"][t.name];
      CAPTURE(a);
      CAPTURE(x);
      CAPTURE(s);
      CHECK(a <= x);
      CHECK(a <= s);
      CHECK((a == x || a == s));
      CHECK(encoding_of(idx, t.name) == (a == s ? Encoding::context : Encoding::xor_bytes));
      CHECK(a == std::min(x, s));
    }
    for (const auto& n : p.want_xor) {
      CAPTURE(n);
      CHECK(encoding_of(idx, n) == Encoding::xor_bytes);
    }
    for (const auto& n : p.want_sparse) {
      CAPTURE(n);
      CHECK(encoding_of(idx, n) == Encoding::context);
    }
    check_applies(dir / "s0", dir / "auto", dir / "s1", dir / "L");
  }
}
