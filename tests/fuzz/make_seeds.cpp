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
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <zstd.h>

#include "codec/codec.hpp"
#include "context_base.hpp"
#include "delta/delta_format_internal.hpp"
#include "delta/parts.hpp"
#include "fuzz_check.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/safetensors.hpp"
#include "parts_lay.hpp"

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
    } else if (target == "parts") {  // as fuzz_parts.cpp: read, then laid where its matrix is the tensor's
      if (bytes.size() < 5) return false;
      const auto entry = bytes.subspan(5);
      const std::uint64_t count = entry.size() >= 8 ? fuzz::le(entry.data() + 4, 4) : 0;
      hfdelta::Hash128 h = hfdelta::parts_checksum(entry.first(
          static_cast<std::size_t>(std::min<std::uint64_t>(entry.size(), hfdelta::kPartsHeadSize + 64 * count))));
      if (bytes[4] & 1) h.low ^= 1;
      const hfdelta::PartsEntry pe = hfdelta::read_parts(entry, h, "seed");
      if (pe.m.bytes() == nbytes) {
        std::vector<std::uint8_t> t = fuzz::parts_tensor(nbytes);
        fuzz::lay_parts(pe, t);
      }
    } else if (target == "context") {
      const fuzz::ContextInput in = fuzz::context_input(bytes.data(), bytes.size());
      const Bytes base = fuzz::context_base(in);
      hfdelta::decode_context(
          in.entry, in.nbytes, "seed",
          [&](std::uint64_t off, std::size_t n) { return std::span<const std::uint8_t>(base).subspan(off, n); },
          [](std::span<const std::uint64_t>, std::span<const std::uint8_t>, std::size_t, hfdelta::SparseOp) {});
    } else if (target == "sparse") {
      hfdelta::decode_sparse(
          frame, nbytes, "seed",
          [](std::span<const std::uint64_t>, std::span<const std::uint8_t>, std::size_t, hfdelta::SparseOp) {});
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
  const std::map<std::string, std::string> checksums{{"layers.0.w", "0123456789abcdef0123456789abcdef"},
                                                     {"layers.1.w", "fedcba9876543210fedcba9876543210"}};
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
  const hfdelta::ByteSink sink = [&](std::span<const std::uint8_t> s) {
    frame.insert(frame.end(), s.begin(), s.end());
  };
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
  hfdelta::encode_sparse(c, a, b, es,
                         [&](std::span<const std::uint8_t> s) { entry.insert(entry.end(), s.begin(), s.end()); });
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
  write("sparse", "valid_hfs1_bf16",
        input(400, sparse_entry(2, 400, kChunk, {xor_changes(a400, changed(a400, 8, 31), 2)})));
  write("sparse", "valid_hfs1_f64", input(64, sparse_entry(8, 64, kChunk, {xor_changes(a64, changed(a64, 5, 33), 8)})));
  // Three chunks of 1-byte elements, the last one of 16.
  const std::vector<SparseChunk> three{{{{0, 0x12}, {kChunk - 1, 0x80}}, {}}, {}, {{{0, 0xff}, {15, 0x01}}, {}}};
  write("sparse", "valid_hfs1_three_chunks", input(2 * kChunk + 16, sparse_entry(1, 2 * kChunk + 16, kChunk, three)));
  write("sparse", "valid_hfs2_three_chunks",
        input(2 * kChunk + 16, sparse_entry(1, 2 * kChunk + 16, kChunk, three, '2')));
  // 60 bf16 elements, values at the edges (0x8000: the most negative
  // difference in HFS2).
  const std::vector<SparseChunk> one{
      {{{0, 0x1234}, {15, 0x0001}, {35, 0xffff}, {48, 0x8000}, {49, 0x0080}, {55, 0x4242}}, {}}};
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
  d.base_checksums = {
      {"model.layers.0.mlp.up_proj.weight", hfdelta::Hash128{0x0123456789abcdefull, 0x1122334455667788ull}},
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

// ---- parts entries (also as stacked layers) -----------------------------------------

struct PartSpec {
  hfdelta::Region g;
  hfdelta::Encoding enc;
};

// Region `g` of the matrix `m` of `t`, row-major.
Bytes region_of(const hfdelta::MatrixShape& m, const Bytes& t, const hfdelta::Region& g) {
  Bytes out;
  for (std::uint64_t r = 0; r < g.rows; ++r) {
    const auto at = t.begin() + static_cast<std::ptrdiff_t>(((g.row0 + r) * m.cols + g.col0) * m.es);
    out.insert(out.end(), at, at + static_cast<std::ptrdiff_t>(g.cols * m.es));
  }
  return out;
}

// A parts entry of matrix `m` turning `base` into `next`, one part per spec,
// each with its region's checksum, as a sharded publisher writes it.
Bytes parts_entry(const hfdelta::MatrixShape& m, const Bytes& base, const Bytes& next,
                  const std::vector<PartSpec>& specs) {
  std::vector<hfdelta::PartRecord> recs;
  Bytes body;
  for (const PartSpec& sp : specs) {
    const Bytes a = region_of(m, base, sp.g), b = region_of(m, next, sp.g);
    Bytes part;
    if (sp.enc == hfdelta::Encoding::xor_bytes) {
      part = encode(true, a, b);
    } else if (sp.enc == hfdelta::Encoding::sparse) {
      part = encode_sparse(a, b, m.es);
    } else {
      hfdelta::Compressor c(1);
      hfdelta::encode_context(c, a, b, m.es, hfdelta::context_field("BF16", 2),
                              [&](std::span<const std::uint8_t> p) { part.insert(part.end(), p.begin(), p.end()); });
    }
    recs.push_back({sp.g, sp.enc, part.size(), hfdelta::xxh3_128(b), {}});
    body = cat(body, part);
  }
  return cat(hfdelta::parts_head(m, recs), body);
}

// ---- stacked entries ---------------------------------------------------------------

// A stacked entry of `parts` (encoding, bytes), with made-up checksums; the
// last is the one the fuzz target expects.
Bytes stacked(const std::vector<std::pair<hfdelta::Encoding, Bytes>>& parts) {
  std::vector<hfdelta::StackLayer> heads;
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
  Bytes ctx;  // revision 5
  hfdelta::Compressor cc(1);
  hfdelta::encode_context(cc, b, c, 2, hfdelta::context_field("BF16", 2),
                          [&](std::span<const std::uint8_t> p) { ctx.insert(ctx.end(), p.begin(), p.end()); });
  write("stack", "valid_xor_context", input(400, stacked({{Encoding::xor_bytes, x}, {Encoding::context, ctx}})));
  const Bytes good = stacked({{Encoding::xor_bytes, x}, {Encoding::sparse, s}});
  auto edit = [&](std::size_t at, std::uint8_t v) {
    Bytes e = good;
    e[at] = v;
    return input(400, e);
  };
  write("stack", "bad_magic", edit(3, '2'));
  write("stack", "bad_no_parts", edit(4, 0));
  write("stack", "bad_more_parts_than_fit", edit(4, 200));
  write("stack", "bad_encoding_5", edit(8, 5));
  write("stack", "bad_reserved", edit(12, 1));
  write("stack", "bad_part_past_end", edit(16 + 7, 0x40));
  write("stack", "bad_trailing_byte", input(400, cat(good, {0})));
  write("stack", "bad_short", input(400, Bytes(good.begin(), good.end() - 1)));
  write("stack", "bad_head_only", input(400, Bytes(good.begin(), good.begin() + 6)));
  write("stack", "bad_last_checksum", edit(8 + 32 + 31, 0));
  // A parts entry as a stacked layer (revision 6): its record holds its
  // head's checksum; laid over the target's tensor, then an xor part.
  const hfdelta::MatrixShape m{20, 10, 2};
  const Bytes base = fuzz::parts_tensor(400), next = changed(base, 6, 53);
  const Bytes pe =
      parts_entry(m, base, next, {{{0, 10, 0, 10}, Encoding::sparse}, {{10, 10, 0, 5}, Encoding::xor_bytes}});
  std::vector<hfdelta::StackLayer> heads{
      {Encoding::parts, pe.size(), hfdelta::parts_checksum(std::span(pe).first(32 + 2 * 64)), {}},
      {Encoding::xor_bytes, x.size(), {fuzz::kStackHashHigh, fuzz::kStackHashLow}, {}}};
  write("stack", "valid_parts_xor", input(400, cat(cat(hfdelta::stack_head(heads), pe), x)));
}

// ---- parts entries ------------------------------------------------------------------

// The parts target's input: tensor size, flags (bit 0: a wrong head checksum), entry.
Bytes parts_input(std::uint32_t nbytes, std::uint8_t flags, const Bytes& entry) {
  return cat(cat(le32(nbytes), {flags}), entry);
}

// `v` as `n` little-endian bytes at `at` of `b`.
Bytes with(Bytes b, std::size_t at, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.at(at + static_cast<std::size_t>(i)) = static_cast<std::uint8_t>(v >> (8 * i));
  return b;
}

void parts_seeds() {
  using hfdelta::Encoding;
  // A 16 x 24 BF16 tensor (768 bytes), as the target builds it, and its next save.
  const hfdelta::MatrixShape m{16, 24, 2};
  const Bytes base = fuzz::parts_tensor(768), next = changed(base, 5, 60);
  const Bytes three = parts_entry(
      m, base, next,
      {{{0, 8, 0, 12}, Encoding::xor_bytes}, {{0, 8, 12, 12}, Encoding::sparse}, {{8, 8, 0, 24}, Encoding::context}});
  write("parts", "valid_xor_sparse_context", parts_input(768, 0, three));
  write("parts", "valid_whole_tensor",
        parts_input(768, 0, parts_entry(m, base, next, {{{0, 16, 0, 24}, Encoding::sparse}})));
  std::vector<PartSpec> columns;
  for (std::uint64_t c = 0; c < 24; c += 6) columns.push_back({{0, 16, c, 6}, Encoding::xor_bytes});
  write("parts", "valid_column_slices", parts_input(768, 0, parts_entry(m, base, next, columns)));
  write("parts", "valid_one_region_of_many",
        parts_input(768, 0, parts_entry(m, base, next, {{{4, 4, 6, 6}, Encoding::context}})));
  write("parts", "valid_scalar",
        parts_input(
            2, 0, parts_entry({1, 1, 2}, fuzz::parts_tensor(2), {0x12, 0x34}, {{{0, 1, 0, 1}, Encoding::xor_bytes}})));
  write("parts", "valid_matrix_not_the_tensor", parts_input(400, 0, three));  // refused by the plan, not read_parts
  // Damaged heads: each breaks one rule (the target checks the head against
  // its own checksum, so only that rule is in the way).
  constexpr std::size_t r0 = 32, r1 = 32 + 64, r2 = 32 + 128;  // part records
  write("parts", "bad_magic", parts_input(768, 0, with(three, 3, '2', 1)));
  write("parts", "bad_wrong_checksum", parts_input(768, 1, three));
  write("parts", "bad_count_zero", parts_input(768, 0, with(three, 4, 0, 4)));
  write("parts", "bad_count_too_large", parts_input(768, 0, with(three, 4, 65537, 4)));
  write("parts", "bad_count_past_entry", parts_input(768, 0, with(three, 4, 200, 4)));
  write("parts", "bad_element_size_3", parts_input(768, 0, with(three, 24, 3, 8)));
  write("parts", "bad_matrix_overflow", parts_input(768, 0, with(with(three, 8, 1ull << 40, 8), 16, 1ull << 40, 8)));
  write("parts", "bad_region_below_matrix", parts_input(768, 0, with(three, r2, 9, 8)));           // rows 9..17 of 16
  write("parts", "bad_region_right_of_matrix", parts_input(768, 0, with(three, r1 + 16, 13, 8)));  // columns 13..25
  write("parts", "bad_region_huge", parts_input(768, 0, with(three, r2 + 8, ~0ull, 8)));
  write("parts", "bad_region_empty", parts_input(768, 0, with(three, r0 + 24, 0, 8)));
  write("parts", "bad_overlapping", parts_input(768, 0, with(three, r1 + 16, 6, 8)));  // columns 6..18 over 0..12
  Bytes swapped = three;  // records 0 and 1 exchanged: out of order
  std::copy_n(three.begin() + r0, 64, swapped.begin() + r1);
  std::copy_n(three.begin() + r1, 64, swapped.begin() + r0);
  write("parts", "bad_unordered", parts_input(768, 0, swapped));
  write("parts", "bad_encoding_overwrite", parts_input(768, 0, with(three, r0 + 32, 1, 4)));
  write("parts", "bad_encoding_parts", parts_input(768, 0, with(three, r0 + 32, 4, 4)));
  write("parts", "bad_reserved", parts_input(768, 0, with(three, r0 + 36, 1, 4)));
  write("parts", "bad_part_past_end", parts_input(768, 0, with(three, r2 + 40, 1u << 20, 8)));
  write("parts", "bad_truncated", parts_input(768, 0, Bytes(three.begin(), three.end() - 1)));
  write("parts", "bad_truncated_records", parts_input(768, 0, Bytes(three.begin(), three.begin() + r2 + 10)));
  write("parts", "bad_trailing_byte", parts_input(768, 0, cat(three, {0})));
  write("parts", "bad_part_checksum", parts_input(768, 0, with(three, r1 + 56, 0, 8)));
  Bytes damaged = three;  // a byte inside the sparse part's frames
  damaged.at(r2 + 64 + fuzz::le(three.data() + r0 + 40, 8) + 40) ^= 0x55;
  write("parts", "bad_part_damaged", parts_input(768, 0, damaged));
}

// ---- context entries ----------------------------------------------------------

// The context target's input for `entry` over the base that `kind`, `seed`
// and `tile` name (context_base.hpp).
struct CtxBase {
  std::uint8_t kind = fuzz::base_zeros, seed = 0;
  Bytes tile;
  fuzz::ContextInput input(std::uint64_t nbytes) const {
    fuzz::ContextInput in;
    in.nbytes = nbytes;
    in.kind = kind;
    in.seed = seed;
    in.tile = tile;
    return in;
  }
};

Bytes context_input(std::uint32_t nbytes, const CtxBase& b, const Bytes& entry) {
  return fuzz::context_input_bytes(nbytes, b.kind, b.seed, b.tile, entry);
}

// The base with the changes of a context input applied; throws the decoder's
// Error where it refuses it.
Bytes context_decoded(const Bytes& bytes) {
  const fuzz::ContextInput in = fuzz::context_input(bytes.data(), bytes.size());
  Bytes out = fuzz::context_base(in);
  const Bytes base = out;
  hfdelta::decode_context(
      in.entry, in.nbytes, "seed",
      [&](std::uint64_t off, std::size_t n) { return std::span<const std::uint8_t>(base).subspan(off, n); },
      [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> v, std::size_t es, hfdelta::SparseOp op) {
        for (std::size_t i = 0; i < offs.size(); ++i)
          hfdelta::sparse_apply_value(out.data() + offs[i], v.data() + i * es, es, op);
      });
  return out;
}

// An element as a little-endian number, and `d` added to it modulo 2^(8 es).
std::uint64_t elem(const Bytes& b, std::size_t e, std::size_t es) {
  std::uint64_t v = 0;
  for (std::size_t k = 0; k < es; ++k) v |= std::uint64_t(b[e * es + k]) << (8 * k);
  return v;
}
void add_elem(Bytes& b, std::size_t e, std::size_t es, std::uint64_t d) {
  const std::uint64_t v = elem(b, e, es) + d;
  for (std::size_t k = 0; k < es; ++k) b[e * es + k] = static_cast<std::uint8_t>(v >> (8 * k));
}

// An optimizer-like step: one unit in the last place up or down, now and then
// a wider difference; elements change more often in odd contexts (the field
// read from the base, as the entry does) than in even ones, so that the
// encoder keeps them in groups of their own.
Bytes step(const Bytes& base, std::size_t es, hfdelta::ContextField f, std::uint64_t seed, unsigned often = 2,
           unsigned rarely = 40) {
  std::mt19937_64 rng(seed);
  Bytes b = base;
  const std::uint64_t mask = (std::uint64_t{1} << f.bits) - 1;
  for (std::size_t e = 0; e < base.size() / es; ++e) {
    const std::uint64_t ctx = f.bits ? (elem(base, e, es) >> f.shift) & mask : 0;
    if (rng() % (ctx & 1 ? often : rarely) != 0) continue;
    const std::uint64_t r = rng();
    const std::uint64_t d = r % 8 == 0 ? 1 + (r >> 8) % 5000 : 1;
    add_elem(b, e, es, r & 16 ? d : 0 - d);
  }
  return b;
}

// The largest differences of `es`-byte elements at elements 0 and 1: -2^(8 es - 1)
// and 2^(8 es - 1) - 1.
void extremes(Bytes& b, std::size_t es) {
  const std::uint64_t half = std::uint64_t{1} << (8 * es - 1);
  add_elem(b, 0, es, half);  // modulo 2^(8 es): the most negative difference
  add_elem(b, 1, es, half - 1);
}

// A context entry taken apart: the head, then per chunk its count, groups and
// streams (Q, M and X decoded; R and S as they lie), to be changed one rule at
// a time and put back together (frames compressed again, by zframe).
struct CtxChunk {
  std::uint64_t K = 0;
  int G = -1;  // the group count written: -1, one more than the thresholds
  Bytes lo, rice;
  std::vector<std::uint64_t> counts;
  Bytes q, r, m, s, x;
  std::optional<Bytes> fx;  // X's frame as written (default: zframe(x), none for no escapes)
};
struct CtxEntry {
  Bytes head;
  std::vector<CtxChunk> chunks;
  bool raw = false;  // frames of raw blocks (raw_zframe)
};

// A zstd frame of raw blocks, with its content size and no checksum: the
// content lies in the seed as it is, so that the fuzzer's mutations of those
// bytes are mutations of the stream, not a broken frame.
Bytes raw_zframe(const Bytes& content) {
  Bytes f{0x28, 0xb5, 0x2f, 0xfd, 0xa0};  // magic; single segment, 4-byte content size
  f = cat(f, le32(static_cast<std::uint32_t>(content.size())));
  std::size_t at = 0;
  do {
    const std::size_t n = std::min<std::size_t>(content.size() - at, 1u << 17);               // the largest block
    const std::uint32_t h = static_cast<std::uint32_t>(n << 3 | (at + n == content.size()));  // raw, last or not
    for (int i = 0; i < 3; ++i) f.push_back(static_cast<std::uint8_t>(h >> (8 * i)));
    f.insert(f.end(), content.begin() + static_cast<std::ptrdiff_t>(at),
             content.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  } while (at < content.size());
  return f;
}

std::uint64_t get_varint(const Bytes& e, std::size_t& at) {
  std::uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const std::uint8_t b = e.at(at++);
    v |= std::uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

Bytes unzstd(const Bytes& e, std::size_t at, std::size_t len) {
  const unsigned long long cs = ZSTD_getFrameContentSize(e.data() + at, len);
  if (cs == ZSTD_CONTENTSIZE_ERROR || cs == ZSTD_CONTENTSIZE_UNKNOWN)
    throw std::runtime_error("context frame without size");
  Bytes out(static_cast<std::size_t>(cs));
  const std::size_t r = ZSTD_decompress(out.data(), out.size(), e.data() + at, len);
  if (ZSTD_isError(r) || r != out.size()) throw std::runtime_error("context frame does not decode");
  return out;
}

CtxEntry parse_context(const Bytes& e) {
  CtxEntry c;
  c.head.assign(e.begin(), e.begin() + hfdelta::kContextHeadSize);
  std::size_t at = hfdelta::kContextHeadSize;
  for (std::uint64_t ch = fuzz::le(e.data() + 24, 8); ch > 0; --ch) {
    CtxChunk k;
    k.K = get_varint(e, at);
    if (k.K) {
      const std::size_t G = e.at(at++);
      k.lo.assign(e.begin() + static_cast<std::ptrdiff_t>(at), e.begin() + static_cast<std::ptrdiff_t>(at + G - 1));
      at += G - 1;
      std::uint64_t rbits = 0;
      for (std::size_t g = 0; g < G; ++g) {
        k.rice.push_back(e.at(at++));
        k.counts.push_back(get_varint(e, at));
        rbits += k.rice.back() * k.counts.back();
      }
      const std::size_t lq = get_varint(e, at), lm = get_varint(e, at), lx = get_varint(e, at);
      const auto raw = [&](std::size_t n) {
        Bytes b(e.begin() + static_cast<std::ptrdiff_t>(at), e.begin() + static_cast<std::ptrdiff_t>(at + n));
        at += n;
        return b;
      };
      k.q = unzstd(e, at, lq), at += lq;
      k.r = raw((rbits + 7) / 8);
      k.m = unzstd(e, at, lm), at += lm;
      k.s = raw((k.K + 7) / 8);
      if (lx) k.x = unzstd(e, at, lx), at += lx;
    }
    c.chunks.push_back(k);
  }
  if (at != e.size()) throw std::runtime_error("parse_context: bytes left over");
  return c;
}

Bytes unparse_context(const CtxEntry& c) {
  Bytes out = c.head;
  for (const CtxChunk& k : c.chunks) {
    put_varint(out, k.K);
    if (!k.K) continue;
    out.push_back(static_cast<std::uint8_t>(k.G >= 0 ? k.G : static_cast<int>(k.lo.size()) + 1));
    out = cat(out, k.lo);
    for (std::size_t g = 0; g < k.rice.size(); ++g) {
      out.push_back(k.rice[g]);
      put_varint(out, k.counts[g]);
    }
    const auto frame = [&](const Bytes& b) { return c.raw ? raw_zframe(b) : zframe(b, true, true); };
    const Bytes fq = frame(k.q), fm = frame(k.m);
    const Bytes fx = k.fx ? *k.fx : k.x.empty() ? Bytes{} : frame(k.x);
    put_varint(out, fq.size());
    put_varint(out, fm.size());
    put_varint(out, fx.size());
    out = cat(cat(cat(cat(cat(out, fq), k.r), fm), k.s), fx);
  }
  return out;
}

// One chunk of a context entry written by hand from `base` and `next` (one
// chunk of `es`-byte elements), with thresholds `lo` (1 + lo.size() groups)
// and Rice parameter `rice` for every group: layouts the encoder does not
// make.
CtxChunk context_chunk_by_hand(const Bytes& base, const Bytes& next, std::size_t es, hfdelta::ContextField f,
                               const Bytes& lo, unsigned rice) {
  const std::size_t G = lo.size() + 1, n = base.size() / es;
  const std::uint64_t mask = (std::uint64_t{1} << f.bits) - 1,
                      top = es == 8 ? ~0ull : (std::uint64_t{1} << (8 * es)) - 1;
  std::vector<std::vector<std::uint64_t>> gaps(G), mags(G);
  std::vector<std::vector<bool>> negs(G);
  std::vector<std::uint64_t> run(G);
  for (std::size_t e = 0; e < n; ++e) {
    const std::uint64_t ctx = f.bits ? (elem(base, e, es) >> f.shift) & mask : 0;
    std::size_t g = 0;
    while (g < lo.size() && ctx >= lo[g]) ++g;
    const std::uint64_t d = (elem(next, e, es) - elem(base, e, es)) & top;
    if (d == 0) {
      ++run[g];
      continue;
    }
    const bool neg = (d >> (8 * es - 1)) & 1;
    gaps[g].push_back(run[g]);
    run[g] = 0;
    mags[g].push_back(neg ? (0 - d) & top : d);
    negs[g].push_back(neg);
  }
  CtxChunk k;
  k.lo = lo;
  Bytes xm;
  std::uint64_t rbits = 0, sbits = 0;
  const auto put_bit = [](Bytes& out, std::uint64_t& at, bool v) {
    if (at % 8 == 0) out.push_back(0);
    out.back() = static_cast<std::uint8_t>(out.back() | v << (at % 8));
    ++at;
  };
  for (std::size_t g = 0; g < G; ++g) {
    k.rice.push_back(static_cast<std::uint8_t>(rice));
    k.counts.push_back(gaps[g].size());
    k.K += gaps[g].size();
    for (const std::uint64_t gap : gaps[g]) {
      const std::uint64_t q = gap >> rice;
      k.q.push_back(static_cast<std::uint8_t>(std::min<std::uint64_t>(q, 255)));
      if (q >= 255) put_varint(k.x, q - 255);
      for (unsigned b = 0; b < rice; ++b) put_bit(k.r, rbits, (gap >> b) & 1);
    }
  }
  for (std::size_t g = 0; g < G; ++g)
    for (std::size_t i = 0; i < mags[g].size(); ++i) {
      const std::uint64_t mv = mags[g][i] - 1;
      k.m.push_back(static_cast<std::uint8_t>(std::min<std::uint64_t>(mv, 255)));
      if (mv >= 255) put_varint(xm, mv - 255);
      put_bit(k.s, sbits, negs[g][i]);
    }
  k.x = cat(k.x, xm);
  return k;
}

// A context seed from encode_context: `next` encoded against the base `b`
// names, checked to decode to `next`; returns the entry.
Bytes context_seed(const std::string& name, std::uint32_t nbytes, const CtxBase& b,
                   const std::function<Bytes(const Bytes&)>& change, std::size_t es, hfdelta::ContextField f) {
  const Bytes base = fuzz::context_base(b.input(nbytes));
  const Bytes next = change(base);
  hfdelta::Compressor c(1);
  Bytes entry;
  hfdelta::encode_context(c, base, next, es, f,
                          [&](std::span<const std::uint8_t> s) { entry.insert(entry.end(), s.begin(), s.end()); });
  const Bytes bytes = context_input(nbytes, b, entry);
  if (context_decoded(bytes) != next)
    throw std::runtime_error("context/" + name + ": does not decode to what was encoded");
  write("context", name, bytes);
  return entry;
}

// A broken context seed, refused with a message that says `why`.
void bad_context(const std::string& name, const Bytes& bytes, const std::string& why) {
  try {
    context_decoded(bytes);
  } catch (const hfdelta::Error& e) {
    if (std::string(e.what()).find(why) == std::string::npos)
      throw std::runtime_error("context/" + name + ": refused for another reason: " + e.what());
  }
  write("context", name, bytes);  // checks that it is refused
}

std::size_t max_groups(const CtxEntry& c) {
  std::size_t g = 0;
  for (const CtxChunk& k : c.chunks) g = std::max(g, k.rice.size());
  return g;
}

void context_seeds() {
  using hfdelta::context_field;
  const CtxBase weights_base{fuzz::base_weights, 1, {}}, noise_base{fuzz::base_noise, 2, {}};
  const auto require = [](bool cond, const std::string& what) {
    if (!cond) throw std::runtime_error("context seeds: " + what);
  };

  // Every element size, with the context field of a float dtype of that size
  // and without one (integers); the ones without one also hold the widest
  // differences of their elements.
  const struct {
    const char* name;
    std::size_t es;
    hfdelta::ContextField f;
  } sizes[] = {{"valid_f8_e4m3", 1, context_field("F8_E4M3", 1)},
               {"valid_bf16", 2, context_field("BF16", 2)},
               {"valid_f32", 4, context_field("F32", 4)},
               {"valid_f64", 8, context_field("F64", 8)}};
  constexpr std::size_t kElems = 3000;  // per seed of each size, one chunk
  std::map<std::size_t, Bytes> with_field;
  for (const auto& s : sizes) {
    const std::uint32_t nbytes = static_cast<std::uint32_t>(kElems * s.es);
    const std::size_t es = s.es;
    const hfdelta::ContextField f = s.f;
    with_field[es] = context_seed(
        s.name, nbytes, weights_base, [&](const Bytes& a) { return step(a, es, f, 40 + es); }, es, f);
    require(max_groups(parse_context(with_field[es])) > 1, std::string(s.name) + " has one context group");
    const Bytes plain = context_seed("valid_no_field_" + std::to_string(es), nbytes, weights_base,
                                     [&](const Bytes& a) {
                                       Bytes b = step(a, es, {}, 50 + es);
                                       extremes(b, es);
                                       return b;
                                     },
                                     es, {});
    require(max_groups(parse_context(plain)) == 1, "no field, more than one group");
  }
  // A field of no bits at bit 64 of 8-byte elements: it fits and reads
  // nothing (the encoder and the decoder once shifted by 64 for it).
  context_seed("valid_no_bits_at_64", 8 * 500, weights_base, [](const Bytes& a) { return step(a, 8, {}, 70); }, 8,
               {64, 0});
  // F16 (a 5-bit field) over noise.
  context_seed(
      "valid_f16_noise_base", 1000, noise_base, [](const Bytes& a) { return step(a, 2, context_field("F16", 2), 60); },
      2, context_field("F16", 2));
  // Many groups (16 allowed, the encoder makes up to 8): the context of a 1-byte element is all of it, and bands
  // of 16 contexts alternate between changing often and rarely.
  const hfdelta::ContextField whole_byte{0, 8};
  const Bytes many = context_seed(
      "valid_u8_many_groups", 6000, noise_base,
      [&](const Bytes& a) {
        std::mt19937_64 rng(61);
        Bytes b = a;
        for (auto& x : b)
          if (rng() % ((x >> 4) & 1 ? 2 : 50) == 0) x = static_cast<std::uint8_t>(x + 1 + rng() % 3);
        return b;
      },
      1, whole_byte);
  require(max_groups(parse_context(many)) >= 8, "valid_u8_many_groups has fewer than 8 groups");
  // The 16 groups the format allows, by hand (bands of 16 contexts, Rice
  // parameter 2), in frames of raw blocks.
  {
    const Bytes a = fuzz::context_base(noise_base.input(6000));
    Bytes next = a;
    std::mt19937_64 rng(63);
    for (std::size_t e = 0; e < next.size(); e += 1 + rng() % 9)
      next[e] = static_cast<std::uint8_t>(next[e] + 1 + rng() % 200);
    next[5999] ^= 1;
    Bytes lo;
    for (int t = 16; t < 256; t += 16) lo.push_back(static_cast<std::uint8_t>(t));
    CtxEntry sixteen;
    sixteen.head.resize(hfdelta::kContextHeadSize);
    hfdelta::context_entry_head(1, 6000, whole_byte, sixteen.head.data());
    sixteen.chunks = {context_chunk_by_hand(a, next, 1, whole_byte, lo, 2)};
    sixteen.raw = true;
    const Bytes bytes = context_input(6000, noise_base, unparse_context(sixteen));
    if (context_decoded(bytes) != next) throw std::runtime_error("context/valid_16_groups_by_hand: does not decode");
    write("context", "valid_16_groups_by_hand", bytes);
  }
  // A base tiled from the input's own bytes.
  const CtxBase tiled{fuzz::base_tile, 0, {0x12, 0x3c, 0x80, 0x3f, 0x00, 0x00, 0x40, 0xbf, 0xff}};
  context_seed(
      "valid_tiled_base", 900, tiled, [](const Bytes& a) { return step(a, 2, context_field("BF16", 2), 62, 2, 5); }, 2,
      context_field("BF16", 2));
  // Escapes: a run of changes then a long gap (a quotient of 255 or more),
  // and differences of 256 and more (magnitudes of 256 and more).
  const Bytes esc = context_seed("valid_escapes", 4 * 110000, CtxBase{},
                                 [](const Bytes& a) {
                                   Bytes b = a;
                                   for (std::size_t e = 0; e < 2000; ++e)
                                     add_elem(b, e, 4, e % 3 ? 1 : 0 - std::uint64_t(1000 * e + 7));
                                   add_elem(b, 109999, 4, 0x7fffffff);
                                   return b;
                                 },
                                 4, {});
  CtxEntry esc_parts = parse_context(esc);
  require(!esc_parts.chunks[0].x.empty(), "valid_escapes has no escapes");
  // Nothing, everything, one element of many changed; an empty tensor.
  context_seed(
      "valid_empty", 0, weights_base, [](const Bytes& a) { return a; }, 2, context_field("BF16", 2));
  const Bytes unchanged = context_seed(
      "valid_unchanged", 1000, weights_base, [](const Bytes& a) { return a; }, 2, context_field("BF16", 2));
  context_seed(
      "valid_all_changed", 1000, weights_base,
      [](const Bytes& a) {
        Bytes b = a;
        for (std::size_t e = 0; e < 500; ++e) add_elem(b, e, 2, e % 2 ? 1 : ~0ull);
        return b;
      },
      2, context_field("BF16", 2));
  context_seed(
      "valid_one_change", 2000, noise_base,
      [](const Bytes& a) {
        Bytes b = a;
        add_elem(b, 999, 2, 3);
        return b;
      },
      2, context_field("BF16", 2));
  // A 4-byte dtype in a 6-byte tensor: one-byte elements, and the F32 field,
  // which does not fit them, replaced by none.
  context_seed(
      "valid_fallback_to_bytes", 6, noise_base,
      [](const Bytes& a) {
        Bytes b = a;
        b[1] ^= 0x10, b[4] ^= 0x01;
        return b;
      },
      4, context_field("F32", 4));
  // Three chunks of one-byte elements (the last of 16): changes on both sides
  // of the first border and in the last element of the first chunk; none in
  // the last chunk.
  constexpr std::uint64_t kChunk = hfdelta::kContextChunkElements;
  const std::uint32_t three = static_cast<std::uint32_t>(2 * kChunk + 16);
  const Bytes chunks3 = context_seed(
      "valid_three_chunks", three, weights_base,
      [&](const Bytes& a) {
        Bytes b = a;
        for (std::uint64_t e : {std::uint64_t(5), std::uint64_t(77), kChunk - 1, kChunk, kChunk + 4000}) b[e] ^= 0x08;
        return b;
      },
      1, context_field("F8_E4M3", 1));
  require(parse_context(chunks3).chunks.size() == 3 && parse_context(chunks3).chunks[2].K == 0, "valid_three_chunks");

  // Broken, one rule each, from the seeds above.
  const Bytes bf16 = with_field[2];
  const auto in_bf16 = [&](const Bytes& e) { return context_input(2 * kElems, weights_base, e); };
  const auto edit = [&](std::size_t at, std::uint8_t v) {
    Bytes e = bf16;
    e.at(at) = v;
    return in_bf16(e);
  };
  bad_context("bad_magic", edit(3, '2'), "does not start with HFC1");
  bad_context("bad_elem_size", edit(4, 3), "element size");
  // A head of 4-byte elements for a 6-byte tensor.
  Bytes misfit = parse_context(unchanged).head;
  misfit[4] = 4;
  for (int i = 0; i < 8; ++i) misfit[8 + i] = static_cast<std::uint8_t>(i == 0 ? 6 : 0);
  bad_context("bad_elem_size_misfit", context_input(6, noise_base, cat(misfit, {0})), "element size");
  bad_context("bad_nbytes", context_input(2 * kElems + 2, weights_base, bf16), "-byte tensor");
  bad_context("bad_chunk_size", edit(18, 0x08), "has chunks of");
  bad_context("bad_chunk_table", edit(24, 2), "inconsistent chunk table");
  bad_context("bad_field_outside", edit(32, 9), "outside a 2-byte element");
  bad_context("bad_field_bits", edit(33, 9), "outside a 2-byte element");
  bad_context("bad_reserved", edit(39, 1), "reserved");
  bad_context("bad_truncated", in_bf16(Bytes(bf16.begin(), bf16.end() - 1)), "truncated");
  bad_context("bad_trailing", in_bf16(cat(bf16, {0})), "extra bytes");

  const CtxEntry ok = parse_context(bf16);
  require(ok.chunks[0].rice.size() >= 3, "valid_bf16 has fewer than 3 groups");
  const auto changed_chunk = [&](const std::function<void(CtxChunk&)>& f, const CtxEntry& from) {
    CtxEntry e = from;
    f(e.chunks[0]);
    return unparse_context(e);
  };
  const auto bad_bf16 = [&](const std::string& name, const std::function<void(CtxChunk&)>& f, const std::string& why) {
    bad_context(name, in_bf16(changed_chunk(f, ok)), why);
  };
  // Put back together unchanged, it is still the same entry; so it is with
  // frames of raw blocks, which the fuzzer can change byte by byte.
  write("context", "valid_bf16_rewritten", in_bf16(changed_chunk([](CtxChunk&) {}, ok)));
  CtxEntry ok_raw = ok;
  ok_raw.raw = true;
  write("context", "valid_bf16_raw_frames", in_bf16(unparse_context(ok_raw)));
  bad_bf16(
      "bad_count_over_elements", [](CtxChunk& k) { k.K = kElems + 1; }, "more changes than it has elements");
  bad_bf16(
      "bad_groups_zero", [](CtxChunk& k) { k.G = 0; }, "context groups");
  bad_bf16(
      "bad_groups_17", [](CtxChunk& k) { k.G = 17; }, "context groups");
  bad_bf16(
      "bad_thresholds_order", [](CtxChunk& k) { k.lo[1] = k.lo[0]; }, "thresholds out of order");
  bad_bf16(
      "bad_rice", [](CtxChunk& k) { k.rice[0] = 25; }, "Rice parameter");
  bad_bf16(
      "bad_group_counts_exceed", [](CtxChunk& k) { ++k.counts.back(); }, "exceed its changes");
  bad_bf16(
      "bad_group_counts_short",
      [](CtxChunk& k) {
        std::size_t g = 0;
        while (k.counts.at(g) == 0) ++g;
        --k.counts[g];
      },
      "do not sum");
  bad_bf16(
      "bad_quotients_short", [](CtxChunk& k) { k.q.pop_back(); }, "quotients");
  bad_bf16(
      "bad_magnitudes_long", [](CtxChunk& k) { k.m.push_back(0); }, "magnitudes");
  // The rest from the chunk without its escapes (quotients and magnitudes
  // of 255 made 254), then one rule broken.
  const auto no_escapes = [](CtxChunk& k) {
    for (auto& v : k.q) v = std::min<std::uint8_t>(v, 254);
    for (auto& v : k.m) v = std::min<std::uint8_t>(v, 254);
    k.x.clear();
  };
  write("context", "valid_bf16_no_escapes", in_bf16(changed_chunk(no_escapes, ok)));
  bad_bf16(
      "bad_escape_unneeded", [&](CtxChunk& k) { no_escapes(k), k.x = {0}; }, "an escape frame but no escapes");
  bad_bf16(
      "bad_escape_missing", [&](CtxChunk& k) { no_escapes(k), k.q[0] = 255; }, "escapes but no escape frame");
  bad_bf16(
      "bad_gap_past_chunk",
      [&](CtxChunk& k) {
        no_escapes(k);
        k.q[0] = 255;
        put_varint(k.x, kElems + 1 - 255);
      },
      "gap longer than the chunk");
  // Two gaps of 2/3 of the chunk or more in one group,
  // each short enough by itself.
  bad_bf16(
      "bad_group_overfull",
      [&](CtxChunk& k) {
        no_escapes(k);
        std::size_t g = 0, at = 0;
        while (k.counts.at(g) < 2) at += k.counts[g++];
        for (std::size_t i = at; i < at + 2; ++i) {
          const std::uint64_t qv = (2 * kElems / 3) >> k.rice[g];
          k.q[i] = static_cast<std::uint8_t>(std::min<std::uint64_t>(qv, 255));
          if (qv >= 255) put_varint(k.x, qv - 255);
        }
      },
      "names more elements in a context group");
  bad_bf16(
      "bad_sign_padding",
      [](CtxChunk& k) {
        if (k.K % 8 == 0) throw std::runtime_error("bad_sign_padding: no padding");
        k.s.back() |= 0x80;
      },
      "padding after its sign bits");
  bad_bf16(
      "bad_value_too_wide",
      [&](CtxChunk& k) {
        no_escapes(k);
        k.m[0] = 255;
        put_varint(k.x, 65535);  // magnitude 256 + 65535
      },
      "wider than its elements");
  // A threshold outside the field: 16 contexts of F8_E4M3.
  CtxEntry e4m3 = parse_context(with_field[1]);
  require(e4m3.chunks[0].lo.size() >= 1, "valid_f8_e4m3 has one group");
  e4m3.chunks[0].lo.back() = 16;
  bad_context("bad_threshold_range", context_input(kElems, weights_base, unparse_context(e4m3)),
              "out of order or range");
  // Escapes: one left over, none where the quotients and magnitudes need
  // them, a frame that is not zstd.
  const auto in_esc = [&](const std::function<void(CtxChunk&)>& f) {
    return context_input(4 * 110000, CtxBase{}, changed_chunk(f, esc_parts));
  };
  bad_context("bad_escape_left_over", in_esc([](CtxChunk& k) { k.x.push_back(0); }), "escape bytes left over");
  bad_context("bad_escape_frame_missing", in_esc([](CtxChunk& k) { k.fx = Bytes{}; }), "escapes but no escape frame");
  bad_context("bad_escape_not_zstd", in_esc([](CtxChunk& k) { k.fx = Bytes{'n', 'o', 't', ' ', 'z', 's', 't', 'd'}; }),
              "not a zstd frame");
  // One-byte elements with escapes (quotients only: a magnitude of 256 or more
  // is wider than the element), also with frames of raw blocks.
  const CtxBase zeros{};
  const auto u8_run = [](const Bytes& a) {
    Bytes b = a;
    for (std::size_t e = 0; e < 300; ++e) b[e] = static_cast<std::uint8_t>(e % 5 ? 1 : 0x80);
    b[60299] = 0x7f;
    return b;
  };
  CtxEntry u8_esc = parse_context(context_seed("valid_u8_escapes", 60300, zeros, u8_run, 1, {}));
  require(!u8_esc.chunks[0].x.empty(), "valid_u8_escapes has no escapes");
  u8_esc.raw = true;
  write("context", "valid_u8_escapes_raw_frames", context_input(60300, zeros, unparse_context(u8_esc)));
  // A magnitude escape in one-byte elements whose 256 + escape wraps around
  // 2^64 to 0: a change of nothing, which the decoder once handed out.
  u8_esc.chunks[0].m[0] = 255;
  put_varint(u8_esc.chunks[0].x, 0 - std::uint64_t{256});
  bad_context("bad_u8_escape_wraps", context_input(60300, zeros, unparse_context(u8_esc)), "wider than its elements");
  // Gap bits with their padding set.
  CtxEntry gp = ok;
  std::uint64_t rbits = 0;
  for (std::size_t g = 0; g < gp.chunks[0].rice.size(); ++g) rbits += gp.chunks[0].rice[g] * gp.chunks[0].counts[g];
  require(rbits % 8 != 0, "valid_bf16 has no gap-bit padding");
  gp.chunks[0].r.back() |= 0x80;
  bad_context("bad_gap_padding", in_bf16(unparse_context(gp)), "padding after its gap bits");
  // Sound entries over a base that is not theirs: all zeros, one context.
  bad_context("bad_wrong_base", context_input(2 * kElems, CtxBase{}, bf16), "not the entry's base");
  // Eleven varint bytes for K.
  Bytes overlong = parse_context(unchanged).head;
  overlong = cat(overlong, {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00});
  bad_context("bad_overlong_varint", context_input(1000, weights_base, overlong), "overlong number");
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
    context_seeds();
    parts_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
