// Writes the seed corpora of the fuzz targets (testdata/fuzz/<target>/):
// valid inputs made by the library's own writer and encoders, and a few broken
// ones next to them, so the fuzzer starts on both sides of every rule.
//
// Usage: make_fuzz_seeds OUTDIR. Deterministic: the same build writes the
// same bytes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <zstd.h>

#include "fuzz_check.hpp"
#include "hfdelta/codec.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/safetensors.hpp"

namespace {

namespace stdfs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

stdfs::path g_out;

// Whether the library accepts a seed of `target`, as its fuzz target calls it.
bool accepted(const std::string& target, std::span<const std::uint8_t> bytes) {
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::uint64_t nbytes = 0;
  for (std::size_t i = 0; i < 4 && i < bytes.size(); ++i) nbytes |= std::uint64_t(bytes[i]) << (8 * i);
  const auto frame = bytes.size() >= 4 ? bytes.subspan(4) : bytes.subspan(bytes.size());
  try {
    if (target == "safetensors") {
      hfdelta::parse_safetensors(text, bytes.size(), "seed");
    } else if (target == "index") {
      hfdelta::parse_delta_index(text, "seed");
    } else if (target == "xor") {
      hfdelta::Decompressor d;
      hfdelta::decode_xor(d, frame, nbytes, "seed", [](std::uint64_t, std::span<const std::uint8_t>) {});
    } else if (target == "stack") {
      hfdelta::read_stack(frame, hfdelta::Hash128{fuzz::kStackHashHigh, fuzz::kStackHashLow}, "seed");
    } else if (target == "sparse") {
      hfdelta::decode_sparse(frame, nbytes, "seed",
                             [](std::span<const std::uint64_t>, std::span<const std::uint8_t>, std::size_t,
                                hfdelta::SparseOp) {});
    } else {
      hfdelta::Decompressor dp, dv;
      hfdelta::decode_overwrite(dp, dv, frame, nbytes, "seed",
                                [](std::span<const std::uint64_t>, std::span<const std::uint8_t>) {});
    }
  } catch (const hfdelta::Error&) {
    return false;
  }
  return true;
}

// Writes one seed after checking that it is what its name says: valid_* seeds
// are accepted, bad_* seeds refused.
void write(const std::string& target, const std::string& name, std::span<const std::uint8_t> bytes) {
  const bool want = name.rfind("valid_", 0) == 0;
  if (!want && name.rfind("bad_", 0) != 0) throw std::runtime_error(name + ": seed names start with valid_ or bad_");
  if (accepted(target, bytes) != want)
    throw std::runtime_error(target + "/" + name + ": the library " + (want ? "refuses" : "accepts") + " it");
  const stdfs::path dir = g_out / target;
  stdfs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + (dir / name).string());
}

void write(const std::string& target, const std::string& name, const std::string& text) {
  write(target, name, std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

// Bytes that look a little like weights: mostly small values, some noise.
Bytes weights(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>((i % 2) ? 0x3c + rng() % 3 : rng());
  return b;
}

// `base` with about one byte in `every` changed.
Bytes changed(const Bytes& base, std::size_t every, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b = base;
  for (std::size_t i = 0; i < b.size(); ++i)
    if (rng() % every == 0) b[i] ^= static_cast<std::uint8_t>(1 + rng() % 255);
  return b;
}

Bytes le32(std::uint32_t v) {
  return {static_cast<std::uint8_t>(v), static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v >> 16),
          static_cast<std::uint8_t>(v >> 24)};
}

Bytes cat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---- safetensors --------------------------------------------------------------

struct Tensor {
  std::string name, dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t nbytes;
};

// A whole file from the library's writer: header, then each tensor's bytes.
std::string safetensors_file(const std::vector<Tensor>& ts, const std::map<std::string, std::string>* meta,
                             std::uint64_t seed) {
  std::vector<hfdelta::TensorSpec> specs;
  for (const auto& t : ts) specs.push_back({t.name, t.dtype, t.shape, t.nbytes});
  const auto layout = hfdelta::layout_safetensors(specs, meta);
  std::string file = layout.prefix;
  const Bytes data = weights(layout.file_size - layout.prefix.size(), seed);
  file.append(data.begin(), data.end());
  if (file.size() != layout.file_size) throw std::runtime_error("layout size mismatch");
  return file;
}

// A file whose header is the given JSON text, padded to 8 bytes, followed by
// `data` bytes: for headers the writer would never produce.
std::string raw_safetensors(std::string json, std::size_t data) {
  json.resize((json.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + std::string(data, '\x11');
}

void safetensors_seeds() {
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  // Valid: every dtype size, a scalar, an empty tensor, an opaque dtype.
  write("safetensors", "valid_mixed.safetensors",
        safetensors_file({{"model.embed.weight", "BF16", {4, 3}, 24},
                          {"model.norm.weight", "F32", {3}, 12},
                          {"model.step", "I64", {}, 8},
                          {"model.mask", "BOOL", {5}, 5},
                          {"model.empty", "F16", {0, 4}, 0},
                          {"model.packed", "F4", {6}, 3},
                          {"lm_head.weight", "F64", {2}, 16}},
                         &meta, 1));
  write("safetensors", "valid_one.safetensors", safetensors_file({{"w", "U8", {16}, 16}}, nullptr, 2));
  write("safetensors", "valid_none.safetensors", safetensors_file({}, &meta, 3));
  const std::map<std::string, std::string> checksums{
      {"layers.0.w", "0123456789abcdef0123456789abcdef"}, {"layers.1.w", "fedcba9876543210fedcba9876543210"}};
  write("safetensors", "valid_delta_shard.safetensors",
        safetensors_file({{"layers.0.w", "U8", {9}, 9}, {"layers.1.w", "U8", {11}, 11}}, &checksums, 4));
  // Another writer's layout: keys in data order, no padding, unicode escapes.
  write("safetensors", "valid_other_writer.safetensors",
        raw_safetensors(R"({"b":{"dtype":"I16","shape":[2],"data_offsets":[0,4]},)"
                        R"("\u00e9":{"dtype":"U8","shape":[1,1],"data_offsets":[4,5]}})",
                        5));

  // Broken: one rule each.
  const std::string ok = safetensors_file({{"a", "F32", {2}, 8}, {"b", "U8", {4}, 4}}, nullptr, 5);
  write("safetensors", "bad_truncated.safetensors", ok.substr(0, ok.size() - 1));
  write("safetensors", "bad_extra_byte.safetensors", ok + '\0');
  std::string long_len = ok;
  long_len[0] = static_cast<char>(0xff);
  write("safetensors", "bad_header_len.safetensors", long_len);
  write("safetensors", "bad_gap.safetensors",
        raw_safetensors(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                        R"("b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
                        5));
  write("safetensors", "bad_overlap.safetensors",
        raw_safetensors(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                        R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                        4));
  write("safetensors", "bad_shape_size.safetensors",
        raw_safetensors(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  write("safetensors", "bad_overflow.safetensors",
        raw_safetensors(R"({"a":{"dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0));
  write("safetensors", "bad_duplicate.safetensors",
        raw_safetensors(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                        R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                        1));
  write("safetensors", "bad_negative.safetensors",
        raw_safetensors(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1));
  write("safetensors", "bad_metadata.safetensors", raw_safetensors(R"({"__metadata__":{"n":1}})", 0));
  write("safetensors", "bad_not_object.safetensors", raw_safetensors(R"([1,2,3])", 0));
  write("safetensors", "bad_utf8.safetensors", raw_safetensors("{\"\xc3\x28\":{}}", 0));
}

// ---- codecs -------------------------------------------------------------------

Bytes encode(bool xor_enc, const Bytes& a, const Bytes& b) {
  hfdelta::Compressor c(1);  // slime's level
  Bytes frame;
  const hfdelta::ByteSink sink = [&](std::span<const std::uint8_t> s) { frame.insert(frame.end(), s.begin(), s.end()); };
  if (xor_enc) {
    hfdelta::encode_xor(c, a, b, sink);
  } else {
    hfdelta::encode_overwrite(c, a, b, hfdelta::count_changes(a, b, 1).bytes, sink);
  }
  return frame;
}

// Any content as a frame of zstd's own, optionally without the content size
// or the checksum (frames other producers may write).
Bytes zframe(const Bytes& content, bool with_size, bool checksum, int level = 3) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, with_size ? 1 : 0);
  ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, checksum ? 1 : 0);
  Bytes out(ZSTD_compressBound(content.size()));
  const std::size_t r = ZSTD_compress2(c, out.data(), out.size(), content.data(), content.size());
  ZSTD_freeCCtx(c);
  if (ZSTD_isError(r)) throw std::runtime_error(ZSTD_getErrorName(r));
  out.resize(r);
  return out;
}

// Fuzz input of the codec targets: the tensor size, then the frame.
Bytes input(std::uint32_t nbytes, const Bytes& frame) { return cat(le32(nbytes), frame); }

void xor_seeds() {
  const Bytes a64 = weights(64, 10), b64 = changed(a64, 4, 11);
  const Bytes f64 = encode(true, a64, b64);
  write("xor", "valid_64", input(64, f64));
  write("xor", "valid_empty", input(0, encode(true, {}, {})));
  const Bytes a3k = weights(3000, 12);
  write("xor", "valid_3000_sparse", input(3000, encode(true, a3k, changed(a3k, 50, 13))));
  // More than one 256 KiB decode buffer: the patch comes in several pieces.
  const Bytes a300k(300000, 0x40);
  write("xor", "valid_300000", input(300000, encode(true, a300k, changed(a300k, 1000, 14))));
  Bytes x(100);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::uint8_t>(a64[i % 64] ^ i);
  write("xor", "valid_no_size_no_checksum", input(100, zframe(x, false, false)));

  write("xor", "bad_size_mismatch", input(65, f64));
  write("xor", "bad_truncated", input(64, Bytes(f64.begin(), f64.end() - 3)));
  write("xor", "bad_trailing", input(64, cat(f64, {0})));
  write("xor", "bad_two_frames", input(128, cat(f64, f64)));
  Bytes corrupt = f64;
  corrupt[corrupt.size() - 1] ^= 0x5a;  // the frame checksum
  write("xor", "bad_checksum", input(64, corrupt));
  write("xor", "bad_short_unsized", input(101, zframe(x, false, true)));
  write("xor", "bad_not_zstd", input(8, Bytes{'n', 'o', 't', ' ', 'z', 's', 't', 'd'}));
}

void overwrite_seeds() {
  const Bytes a100 = weights(100, 20), b100 = changed(a100, 20, 21);
  const Bytes f100 = encode(false, a100, b100);
  write("overwrite", "valid_100", input(100, f100));
  write("overwrite", "valid_unchanged", input(40, encode(false, weights(40, 22), weights(40, 22))));
  write("overwrite", "valid_empty", input(0, encode(false, {}, {})));
  const Bytes a64k = weights(65536, 23);
  write("overwrite", "valid_65536", input(65536, encode(false, a64k, changed(a64k, 30, 24))));
  // Hand-made payloads: K, positions, values.
  const auto payload = [](const std::vector<std::uint32_t>& pos) {
    Bytes p = le32(static_cast<std::uint32_t>(pos.size()));
    for (auto v : pos) p = cat(p, le32(v));
    for (std::size_t i = 0; i < pos.size(); ++i) p.push_back(static_cast<std::uint8_t>(0xa0 + i));
    return p;
  };
  // More positions than one 16 Ki batch of the decoder (every other byte of
  // a 40000-byte tensor), compressed hard to keep the seed small.
  std::vector<std::uint32_t> every_other;
  for (std::uint32_t i = 0; i < 40000; i += 2) every_other.push_back(i);
  write("overwrite", "valid_20000_positions", input(40000, zframe(payload(every_other), true, true, 19)));
  write("overwrite", "valid_no_size_no_checksum", input(16, zframe(payload({0, 3, 15}), false, false)));

  write("overwrite", "bad_descending", input(16, zframe(payload({0, 5, 4}), true, true)));
  write("overwrite", "bad_repeated", input(16, zframe(payload({2, 2}), true, true)));
  write("overwrite", "bad_out_of_range", input(16, zframe(payload({1, 16}), true, true)));
  write("overwrite", "bad_k_too_big", input(2, zframe(payload({0, 1, 2}), true, true)));
  Bytes short_values = payload({1, 2, 3});
  short_values.pop_back();
  write("overwrite", "bad_short_values", input(16, zframe(short_values, false, true)));
  write("overwrite", "bad_extra_values", input(16, zframe(cat(payload({1, 2}), {7}), true, true)));
  write("overwrite", "bad_truncated", input(100, Bytes(f100.begin(), f100.end() - 2)));
  write("overwrite", "bad_trailing", input(100, cat(f100, {0, 0})));
}

// A sparse entry put together by hand, for what the encoder no longer writes
// ("HFS1" entries of XOR values, written before "HFS2") and for broken ones.
// `chunks[c]` lists the changed elements of chunk c as (index within the
// chunk, stored value of the element: XOR for "HFS1", zigzag(new - old) for
// "HFS2").
struct SparseChunk {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> changes;
  Bytes gaps_extra;  // appended to the decoded positions
};

void put_le64(Bytes& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

void put_varint(Bytes& out, std::uint64_t v) {
  while (v >= 0x80) out.push_back(static_cast<std::uint8_t>(v | 0x80)), v >>= 7;
  out.push_back(static_cast<std::uint8_t>(v));
}

Bytes sparse_entry(std::uint32_t es, std::uint64_t nbytes, std::uint64_t chunk_elements,
                   const std::vector<SparseChunk>& chunks, char revision = '1',
                   const std::optional<Bytes>& first_gaps = std::nullopt) {
  Bytes out{'H', 'F', 'S', static_cast<std::uint8_t>(revision)};
  out = cat(out, le32(es));
  put_le64(out, nbytes);
  put_le64(out, chunk_elements);
  put_le64(out, chunks.size());
  for (const auto& ch : chunks) {
    Bytes gaps;
    std::uint64_t next = 0;
    for (const auto& [e, x] : ch.changes) {
      put_varint(gaps, e - next);
      next = e + 1;
    }
    if (first_gaps && &ch == &chunks.front()) gaps = *first_gaps;  // decoded positions written as given
    gaps = cat(gaps, ch.gaps_extra);
    std::vector<Bytes> frames{zframe(gaps, false, true)};
    for (std::uint32_t b = 0; b < es; ++b) {
      Bytes plane;
      for (const auto& [e, x] : ch.changes) plane.push_back(static_cast<std::uint8_t>(x >> (8 * b)));
      frames.push_back(zframe(plane, true, true));
    }
    put_le64(out, ch.changes.size());
    for (const auto& f : frames) put_le64(out, f.size());
    for (const auto& f : frames) out = cat(out, f);
  }
  return out;
}

Bytes encode_sparse(const Bytes& a, const Bytes& b, std::size_t es) {
  hfdelta::Compressor c(1);
  Bytes entry;
  hfdelta::encode_sparse(c, a, b, es, [&](std::span<const std::uint8_t> s) { entry.insert(entry.end(), s.begin(), s.end()); });
  // The seeds named as the encoder's are of the revision it writes.
  if (entry.size() < 4 || std::string_view(reinterpret_cast<const char*>(entry.data()), 4) != "HFS2")
    throw std::runtime_error("encode_sparse no longer writes HFS2 entries: revisit the sparse seeds");
  return entry;
}

// The changes between `a` and `b` (es-byte elements, one chunk) as the
// (element, XOR value) list of an "HFS1" entry.
SparseChunk xor_changes(const Bytes& a, const Bytes& b, std::size_t es) {
  SparseChunk ch;
  for (std::size_t e = 0; e < a.size() / es; ++e) {
    std::uint64_t x = 0;
    for (std::size_t k = 0; k < es; ++k) x |= std::uint64_t(a[e * es + k] ^ b[e * es + k]) << (8 * k);
    if (x) ch.changes.push_back({e, x});
  }
  return ch;
}

void sparse_seeds() {
  constexpr std::uint64_t kChunk = hfdelta::kSparseChunkElements;
  // From the encoder (HFS2): every element size, nothing changed, everything
  // changed, a dtype size that does not divide the tensor.
  const Bytes a400 = weights(400, 30);
  write("sparse", "valid_bf16", input(400, encode_sparse(a400, changed(a400, 8, 31), 2)));
  write("sparse", "valid_f32_unchanged", input(400, encode_sparse(a400, a400, 4)));
  const Bytes a64 = weights(64, 32);
  write("sparse", "valid_f64", input(64, encode_sparse(a64, changed(a64, 5, 33), 8)));
  const Bytes a37 = weights(37, 34);
  write("sparse", "valid_u8_odd", input(37, encode_sparse(a37, changed(a37, 3, 35), 1)));
  // A 4-byte dtype in a 6-byte tensor: the encoder falls back to bytes.
  const Bytes a6 = weights(6, 36);
  write("sparse", "valid_fallback_to_bytes", input(6, encode_sparse(a6, changed(a6, 2, 37), 4)));
  write("sparse", "valid_empty", input(0, encode_sparse({}, {}, 2)));
  // Every element of a 3000-element bf16 tensor changed: all gaps zero.
  const Bytes a6k = weights(6000, 38);
  Bytes b6k = a6k;
  for (auto& x : b6k) x = static_cast<std::uint8_t>(x + 1);
  write("sparse", "valid_all_changed", input(6000, encode_sparse(a6k, b6k, 2)));
  // One-ulp steps up and down in f32 elements, and differences that wrap
  // around (0x0000 <-> 0xffff, 0x7fff <-> 0x8000): the values HFS2 stores
  // small (1, 2) and its largest (0xffff for 0x0000 -> 0x8000).
  Bytes b400 = a400;
  for (std::size_t e = 0; e < 100; e += 3) {
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= std::uint32_t(b400[4 * e + k]) << (8 * k);
    v += e % 2 ? 1 : 0xffffffffu;
    for (int k = 0; k < 4; ++k) b400[4 * e + k] = static_cast<std::uint8_t>(v >> (8 * k));
  }
  write("sparse", "valid_f32_steps", input(400, encode_sparse(a400, b400, 4)));
  const Bytes wrap_a{0x00, 0x00, 0xff, 0xff, 0xff, 0x7f, 0x00, 0x80, 0x00, 0x00, 0x80, 0x3f};
  const Bytes wrap_b{0xff, 0xff, 0x00, 0x00, 0x00, 0x80, 0xff, 0x7f, 0x00, 0x80, 0x81, 0x3f};
  write("sparse", "valid_bf16_wrap", input(12, encode_sparse(wrap_a, wrap_b, 2)));
  // Two chunks of bf16 (2^20 + 8 elements, the fuzz target's largest), with
  // changes on both sides of the border and in the last element.
  const std::uint32_t two_chunks = 2 * (kChunk + 8);
  const Bytes big(two_chunks, 0x3c);
  Bytes big_b = big;
  for (std::uint64_t e : {std::uint64_t(5), kChunk - 1, kChunk, kChunk + 7}) big_b[2 * e] = 0x3d;
  write("sparse", "valid_two_chunks", input(two_chunks, encode_sparse(big, big_b, 2)));

  // By hand, HFS1 (XOR values), as the encoder wrote them before HFS2: the
  // decoder still reads them.
  write("sparse", "valid_hfs1_bf16", input(400, sparse_entry(2, 400, kChunk, {xor_changes(a400, changed(a400, 8, 31), 2)})));
  write("sparse", "valid_hfs1_f64", input(64, sparse_entry(8, 64, kChunk, {xor_changes(a64, changed(a64, 5, 33), 8)})));
  // Three chunks of 1-byte elements, the last one of 16.
  const std::vector<SparseChunk> three{{{{0, 0x12}, {kChunk - 1, 0x80}}, {}}, {}, {{{0, 0xff}, {15, 0x01}}, {}}};
  write("sparse", "valid_hfs1_three_chunks", input(2 * kChunk + 16, sparse_entry(1, 2 * kChunk + 16, kChunk, three)));
  write("sparse", "valid_hfs2_three_chunks", input(2 * kChunk + 16, sparse_entry(1, 2 * kChunk + 16, kChunk, three, '2')));
  // 60 bf16 elements, values at the edges (0x8000: the most negative
  // difference in HFS2).
  const std::vector<SparseChunk> one{{{{0, 0x1234}, {15, 0x0001}, {35, 0xffff}, {48, 0x8000}, {49, 0x0080}, {55, 0x4242}}, {}}};
  write("sparse", "valid_hfs1_edges", input(120, sparse_entry(2, 120, kChunk, one)));
  write("sparse", "valid_hfs2_edges", input(120, sparse_entry(2, 120, kChunk, one, '2')));

  // Broken, one rule each: HFS1 ones (the rules do not depend on the
  // revision) and a few HFS2 ones.
  const Bytes ok = sparse_entry(2, 120, kChunk, one);
  Bytes magic = ok;
  magic[3] = '3';  // a revision that does not exist (yet)
  write("sparse", "bad_magic", input(120, magic));
  magic[3] = '0';
  write("sparse", "bad_magic_hfs0", input(120, magic));
  write("sparse", "bad_nbytes", input(122, ok));
  write("sparse", "bad_truncated", input(120, Bytes(ok.begin(), ok.end() - 1)));
  write("sparse", "bad_trailing", input(120, cat(ok, {0})));
  write("sparse", "bad_elem_size", input(120, sparse_entry(3, 120, kChunk, one)));
  write("sparse", "bad_elem_size_misfit", input(6, sparse_entry(4, 6, kChunk, {{{{0, 1}}, {}}})));
  // The format fixes the chunk size at 2^20 elements (revision 2).
  write("sparse", "bad_chunk_size", input(120, sparse_entry(2, 120, 16, {one[0], {}, {}, {}})));
  write("sparse", "bad_zero_chunk", input(120, sparse_entry(2, 120, 0, {})));
  write("sparse", "bad_chunk_table", input(120, sparse_entry(2, 120, kChunk, {one[0], {}})));
  write("sparse", "bad_position_outside_chunk",
        input(2 * kChunk + 16, sparse_entry(1, 2 * kChunk + 16, kChunk, {{{{kChunk, 1}}, {}}, {}, {}})));
  write("sparse", "bad_position_past_end", input(120, sparse_entry(2, 120, kChunk, {{{{60, 1}}, {}}})));
  write("sparse", "bad_gaps_extra", input(120, sparse_entry(2, 120, kChunk, {{{{1, 1}}, {0}}})));
  // Eleven varint bytes for the one position: more than 64 bits.
  write("sparse", "bad_overlong_varint",
        input(120, sparse_entry(2, 120, kChunk, {{{{0, 1}}, {}}}, '1',
                               Bytes{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00})));
  // The chunk declares 7 changes but has positions and values for 6; then
  // more changes than it has elements.
  Bytes count = ok;
  count[32] = 7;
  write("sparse", "bad_count", input(120, count));
  count[32] = 61;
  write("sparse", "bad_count_over_elements", input(120, count));
  const Bytes ok2 = encode_sparse(a400, changed(a400, 8, 31), 2);
  write("sparse", "bad_hfs2_truncated", input(400, Bytes(ok2.begin(), ok2.end() - 1)));
  write("sparse", "bad_hfs2_nbytes", input(402, ok2));
  Bytes count2 = ok2;
  count2[32] = static_cast<std::uint8_t>(count2[32] + 1);  // K one more than the positions and values
  write("sparse", "bad_hfs2_count", input(400, count2));
  write("sparse", "bad_hfs2_position_past_end", input(120, sparse_entry(2, 120, kChunk, {{{{60, 1}}, {}}}, '2')));
}

// ---- delta index --------------------------------------------------------------

void index_seeds() {
  hfdelta::DeltaIndex d;
  d.version = 7;
  d.base_version = 6;
  d.encoding = hfdelta::Encoding::xor_bytes;
  d.weight_map = {{"model.layers.0.mlp.up_proj.weight", "model-00000-of-00001.safetensors"},
                  {"model.norm.weight", "model-00000-of-00001.safetensors"}};
  d.base_checksums = {{"model.layers.0.mlp.up_proj.weight", hfdelta::Hash128{0x0123456789abcdefull, 0x1122334455667788ull}},
                      {"model.norm.weight", hfdelta::Hash128{1, 2}}};
  hfdelta::FileChange put;
  put.path = "files/config.json";
  put.size = 812;
  put.hash = hfdelta::Hash128{0xfeedfacecafebeefull, 42};
  hfdelta::FileChange rm;
  rm.path = "files/tokenizer/old.model";
  rm.op = hfdelta::FileChange::Op::remove;
  d.files = {put, rm};
  write("index", "valid_hfdelta.json", hfdelta::write_delta_index_json(d, 123456));
  d.encoding = hfdelta::Encoding::overwrite;
  d.files.clear();
  d.base_checksums.clear();
  write("index", "valid_overwrite.json", hfdelta::write_delta_index_json(d, 99));
  d.encoding = hfdelta::Encoding::sparse;
  write("index", "valid_sparse.json", hfdelta::write_delta_index_json(d, 99));
  d.per_tensor = true;
  d.encodings = {{"model.layers.0.mlp.up_proj.weight", hfdelta::Encoding::sparse},
                 {"model.norm.weight", hfdelta::Encoding::xor_bytes}};
  write("index", "valid_auto.json", hfdelta::write_delta_index_json(d, 99));
  d.encodings["model.norm.weight"] = hfdelta::Encoding::stack;  // revision 4
  write("index", "valid_auto_stack.json", hfdelta::write_delta_index_json(d, 99));
  d.encodings.erase("model.norm.weight");
  write("index", "bad_auto_missing.json", hfdelta::write_delta_index_json(d, 99));
  d.per_tensor = false;
  d.encodings.clear();
  // As slime writes it: no hfdelta extensions.
  write("index", "valid_slime.json",
        R"({"metadata": {"version": "000002", "base_version": "000001", "delta_encoding": "xor", )"
        R"("compression_format": "zstd", "checksum_format": "xxh3-128", "total_size": 4096}, )"
        R"("weight_map": {"lm_head.weight": "model-00000-of-00001.safetensors"}})");
  write("index", "valid_numbers.json",
        R"({"metadata": {"version": 3, "base_version": 2, "delta_encoding": "overwrite"}, "weight_map": {}})");

  const auto with = [](const std::string& meta, const std::string& wm) {
    return R"({"metadata": {"version": "000002", "base_version": "000001", "delta_encoding": "xor")" + meta +
           R"(}, "weight_map": {)" + wm + "}}";
  };
  const std::string shard = R"("t": "model-00000-of-00001.safetensors")";
  write("index", "bad_newer_format.json",
        with(", \"hfdelta_format\": " + std::to_string(hfdelta::kFormatRevision + 1), shard));
  write("index", "bad_encoding.json",
        R"({"metadata": {"version": "2", "base_version": "1", "delta_encoding": "bitmask"}, "weight_map": {}})");
  write("index", "bad_compression.json", with(R"(, "compression_format": "lz4")", shard));
  write("index", "bad_dotdot.json", with("", R"("t": "../model.safetensors")"));
  write("index", "bad_subdir.json", with("", R"("t": "sub/model.safetensors")"));
  write("index", "bad_hash.json", with(R"(, "hfdelta_base_checksums": {"t": "0123"})", shard));
  write("index", "bad_files_twice.json",
        with(R"(, "hfdelta_files": [{"path": "a.json", "op": "remove"}, {"path": "a.json", "op": "remove"}])", shard));
  write("index", "bad_files_op.json", with(R"(, "hfdelta_files": [{"path": "a.json", "op": "chmod"}])", shard));
  write("index", "bad_files_abs.json", with(R"(, "hfdelta_files": [{"path": "/etc/passwd", "op": "remove"}])", shard));
  write("index", "bad_version.json",
        R"({"metadata": {"version": "v2", "base_version": "1", "delta_encoding": "xor"}, "weight_map": {}})");
  write("index", "bad_not_delta.json", R"({"metadata": {"total_size": 1}, "weight_map": {}})");
  write("index", "bad_json.json", R"({"metadata": {"version": "2",)");
}

// ---- stacked entries ---------------------------------------------------------------

// A stacked entry of `parts` (encoding, bytes), with made-up checksums; the
// last is the one the fuzz target expects.
Bytes stacked(const std::vector<std::pair<hfdelta::Encoding, Bytes>>& parts) {
  std::vector<hfdelta::StackPart> heads;
  for (std::size_t i = 0; i < parts.size(); ++i)
    heads.push_back({parts[i].first, parts[i].second.size(), hfdelta::Hash128{i + 1, 0x1234}, {}});
  heads.back().hash = {fuzz::kStackHashHigh, fuzz::kStackHashLow};
  Bytes e = hfdelta::stack_head(heads);
  for (const auto& [enc, b] : parts) e = cat(e, b);
  return e;
}

void stack_seeds() {
  using hfdelta::Encoding;
  const Bytes a = weights(400, 50), b = changed(a, 8, 51), c = changed(b, 8, 52);
  const Bytes x = encode(true, a, b), s = encode_sparse(b, c, 2), o = encode(false, b, c);
  write("stack", "valid_xor_sparse", input(400, stacked({{Encoding::xor_bytes, x}, {Encoding::sparse, s}})));
  write("stack", "valid_sparse_overwrite_xor",
        input(400, stacked({{Encoding::sparse, s}, {Encoding::overwrite, o}, {Encoding::xor_bytes, x}})));
  write("stack", "valid_one_part", input(400, stacked({{Encoding::overwrite, o}})));
  write("stack", "valid_empty_part", input(400, stacked({{Encoding::xor_bytes, x}, {Encoding::overwrite, {}}})));
  const Bytes good = stacked({{Encoding::xor_bytes, x}, {Encoding::sparse, s}});
  auto edit = [&](std::size_t at, std::uint8_t v) {
    Bytes e = good;
    e[at] = v;
    return input(400, e);
  };
  write("stack", "bad_magic", edit(3, '2'));
  write("stack", "bad_no_parts", edit(4, 0));
  write("stack", "bad_more_parts_than_fit", edit(4, 200));
  write("stack", "bad_encoding_3", edit(8, 3));
  write("stack", "bad_reserved", edit(12, 1));
  write("stack", "bad_part_past_end", edit(16 + 7, 0x40));
  write("stack", "bad_trailing_byte", input(400, cat(good, {0})));
  write("stack", "bad_short", input(400, Bytes(good.begin(), good.end() - 1)));
  write("stack", "bad_head_only", input(400, Bytes(good.begin(), good.begin() + 6)));
  write("stack", "bad_last_checksum", edit(8 + 32 + 31, 0));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
    return 2;
  }
  g_out = argv[1];
  try {
    safetensors_seeds();
    xor_seeds();
    overwrite_seeds();
    sparse_seeds();
    index_seeds();
    stack_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
