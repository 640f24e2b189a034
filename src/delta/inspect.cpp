#include "hfdelta/inspect.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include <zstd.h>
#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "codec/codec_internal.hpp"
#include "delta/delta_reader.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/version.hpp"
#include "util/io.hpp"
#include "util/json_text.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using nlohmann::json;

namespace {

std::uint32_t le32(const std::uint8_t* p) {
  return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24;
}

std::uint64_t le64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

constexpr std::uint32_t kZstdMagic = 0xFD2FB528u;

// A frame checked without decompressing it: the current zstd format (what
// FrameReader accepts), exactly one complete frame filling `f` (zstd walks the
// block headers only). Returns the declared content size, if any.
std::optional<std::uint64_t> check_frame_shape(std::span<const std::uint8_t> f, const std::string& what) {
  if (f.size() < 4 || le32(f.data()) != kZstdMagic) fail(Exit::bad_input, what + ": is not a zstd frame");
  const std::size_t n = ZSTD_findFrameCompressedSize(f.data(), f.size());
  if (ZSTD_isError(n))
    fail(Exit::bad_input, what + ": zstd frame is truncated or corrupt (" + ZSTD_getErrorName(n) + ")");
  if (n != f.size())
    fail(Exit::bad_input, what + ": zstd frame is followed by " + std::to_string(f.size() - n) + " extra bytes");
  const unsigned long long cs = ZSTD_getFrameContentSize(f.data(), f.size());
  if (cs == ZSTD_CONTENTSIZE_ERROR) fail(Exit::bad_input, what + ": zstd frame header is corrupt");
  if (cs == ZSTD_CONTENTSIZE_UNKNOWN) return std::nullopt;
  return cs;
}

// sparse: the head and every chunk head, the chunks' K summed, then every
// frame decoded (in bounded pieces) and checked as delta-apply checks it, so
// damage anywhere in the entry is found. The layout is the one documented in
// codec.cpp.
void inspect_sparse(std::span<const std::uint8_t> e, const std::string& what, InspectEntry& out) {
  auto bad = [&](const std::string& msg) { fail(Exit::bad_input, what + ": sparse entry " + msg); };
  std::uint64_t at = 0;
  auto take = [&](std::uint64_t k) {
    if (k > e.size() - at) bad("is truncated");
    const std::uint8_t* p = e.data() + at;
    at += k;
    return p;
  };
  const SparseHead head = read_sparse_head(e, what);
  take(kSparseHeadSize);
  const std::uint32_t es = head.es;
  const std::uint64_t nbytes = head.nbytes, chunk_elems = head.chunk_elements, chunks = head.chunks;
  if ((es != 1 && es != 2 && es != 4 && es != 8) || sparse_elem_size(es, nbytes) != es)
    bad("has element size " + std::to_string(es) + ", which does not fit a " + std::to_string(nbytes) + "-byte tensor");
  if (chunk_elems != kSparseChunkElements)
    bad("has chunks of " + std::to_string(chunk_elems) + " elements, not " + std::to_string(kSparseChunkElements));
  if (chunks != sparse_chunk_count(nbytes, es)) bad("has an inconsistent chunk table");
  const std::uint64_t n = nbytes / es;
  std::uint64_t changed = 0;
  // Every chunk head takes bytes of the entry, so a hostile chunk count ends
  // in "is truncated" long before the loop could run long.
  for (std::uint64_t ch = 0; ch < chunks; ++ch) {
    const std::uint64_t e0 = ch * chunk_elems, e1 = std::min(n, e0 + chunk_elems);
    const std::uint8_t* chunk_head = take(16 + 8 * std::uint64_t(es));
    const std::uint64_t k = le64(chunk_head);
    if (k > e1 - e0) bad("chunk " + std::to_string(ch) + " declares more changes than it has elements");
    const std::string cw = what + ": sparse chunk " + std::to_string(ch);
    const std::uint64_t gaps_len = le64(chunk_head + 8);
    const auto gaps = check_frame_shape({take(gaps_len), gaps_len}, cw + " positions");
    // Each position is a varint of at least one byte.
    if (gaps && *gaps < k)
      bad("chunk " + std::to_string(ch) + " has " + std::to_string(*gaps) + " position bytes for " + std::to_string(k) +
          " changes");
    for (std::uint32_t b = 0; b < es; ++b) {
      const std::uint64_t len = le64(chunk_head + 16 + 8 * b);
      const auto cs = check_frame_shape({take(len), len}, cw + " plane " + std::to_string(b));
      if (cs && *cs != k)
        bad("chunk " + std::to_string(ch) + " plane " + std::to_string(b) + " declares " + std::to_string(*cs) +
            " bytes for " + std::to_string(k) + " changes");
    }
    changed += k;
  }
  if (at != e.size()) bad("is followed by " + std::to_string(e.size() - at) + " extra bytes");
  decode_sparse(e, nbytes, what, [](auto, auto, auto, auto) {});
  out.tensor_bytes = nbytes;
  out.element_size = es;
  out.changed_elements = changed;
}

// context: everything but the walk over the base (check_context): heads,
// group tables, every frame decoded, stream lengths and padding, positions
// that fit their chunk, values that fit their elements.
void inspect_context(std::span<const std::uint8_t> e, const std::string& what, InspectEntry& out) {
  if (e.size() < kContextHeadSize) fail(Exit::bad_input, what + ": context entry is truncated");
  const std::uint64_t nbytes = get_le64(e.data() + 8);
  const ContextSummary s = check_context(e, nbytes, what);
  out.tensor_bytes = nbytes;
  out.element_size = s.elem_size;
  out.changed_elements = s.changes;
  out.needs_base = true;
}

// overwrite: K is the frame's first four decoded bytes; the target's length
// is not in the entry, so positions are checked against the format's 4 GiB
// limit (and for ascending order) as the whole frame is decoded.
void inspect_overwrite(std::span<const std::uint8_t> e, const std::string& what, InspectEntry& out) {
  const auto cs = check_frame_shape(e, what);
  Decompressor d;
  FrameReader r(d, e, what);
  std::uint8_t kb[4];
  r.read(kb, 4);
  const std::uint64_t k = le32(kb);
  if (cs && *cs != 4 + 5 * k)
    fail(Exit::bad_input, what + ": zstd frame declares " + std::to_string(*cs) + " bytes, expected " +
                              std::to_string(4 + 5 * k) + " for " + std::to_string(k) + " changed bytes");
  Decompressor dp, dv;
  decode_overwrite(dp, dv, e, 1ull << 32, what, [](auto, auto) {});
  out.changed_bytes = k;
}

std::uint64_t count_nonzero(std::span<const std::uint8_t> s) {
  std::uint64_t n = 0;
  for (const std::uint8_t b : s) n += b != 0;
  return n;
}

// xor: the mask decoded in bounded pieces; every non-zero byte is a changed byte.
void inspect_xor(std::span<const std::uint8_t> e, const std::string& what, InspectEntry& out) {
  const auto cs = check_frame_shape(e, what);
  Decompressor d;
  std::uint64_t nonzero = 0, len = 0;
  if (cs) {
    decode_xor(d, e, *cs, what,
               [&](std::uint64_t, std::span<const std::uint8_t> piece) { nonzero += count_nonzero(piece); });
    len = *cs;
  } else {
    // Frames from other publishers may not declare their size: the length
    // is then what the frame decodes to.
    FrameReader r(d, e, what);
    for (auto piece = r.next(); !piece.empty(); piece = r.next()) {
      nonzero += count_nonzero(piece);
      len += piece.size();
    }
  }
  out.tensor_bytes = len;
  out.changed_bytes = nonzero;
}

void inspect_part(Encoding enc, std::span<const std::uint8_t> bytes, const std::string& what, InspectEntry& out) {
  switch (enc) {
    case Encoding::sparse:
      return inspect_sparse(bytes, what, out);
    case Encoding::overwrite:
      return inspect_overwrite(bytes, what, out);
    case Encoding::xor_bytes:
      return inspect_xor(bytes, what, out);
    case Encoding::context:
      return inspect_context(bytes, what, out);
    case Encoding::stack:
    case Encoding::parts:
      break;
  }
  fail(Exit::bad_input, what + ": a part of this kind cannot hold a stacked or parts entry");
}

// A parts entry (or a stacked parts layer): each region's part checked as an
// entry of its encoding for the region's bytes.
void inspect_parts(const PartsEntry& pe, const std::string& what, InspectEntry& out) {
  out.tensor_bytes = pe.m.bytes();
  for (std::size_t i = 0; i < pe.parts.size(); ++i) {
    const PartRecord& pr = pe.parts[i];
    InspectEntry e;
    const std::string pw = what + " (part " + std::to_string(i + 1) + ")";
    inspect_part(pr.enc, pr.bytes, pw, e);
    if (e.tensor_bytes && *e.tensor_bytes != pr.region.elements() * pe.m.es)
      fail(Exit::bad_input, pw + ": is for " + std::to_string(*e.tensor_bytes) + " bytes, its region holds " +
                                std::to_string(pr.region.elements() * pe.m.es));
    out.needs_base = out.needs_base || e.needs_base;
  }
}

InspectEntry inspect_entry(const OpenDelta& v, const DeltaEntry& de) {
  InspectEntry e;
  e.tensor = de.tensor();
  e.file = *de.file;
  e.encoding = de.encoding;
  e.entry_bytes = de.frame.size();
  e.checksum = de.new_hash;
  e.adler32 = de.adler32;
  e.base_checksum = de.base_hash;
  const std::string what = v.path_of(de) + ": entry '" + de.tensor() + "'";
  if (de.parts) {
    e.pieces = de.parts->parts.size();
    inspect_parts(*de.parts, what, e);
    return e;
  }
  if (de.encoding != Encoding::stack) {
    inspect_part(e.encoding, de.frame, what, e);
    return e;
  }
  e.pieces = de.layers.size();
  for (std::size_t i = 0; i < de.layers.size(); ++i) {
    InspectEntry pe;
    const std::string pw = what + " (stacked layer " + std::to_string(i + 1) + ")";
    if (de.layer_parts[i])
      inspect_parts(*de.layer_parts[i], pw, pe);
    else
      inspect_part(de.layers[i].enc, de.layers[i].bytes, pw, pe);
    if (pe.tensor_bytes && e.tensor_bytes && *pe.tensor_bytes != *e.tensor_bytes)
      fail(Exit::bad_input, what + ": stacked layers are for tensors of " + std::to_string(*e.tensor_bytes) + " and " +
                                std::to_string(*pe.tensor_bytes) + " bytes");
    if (pe.tensor_bytes) e.tensor_bytes = pe.tensor_bytes;
    e.needs_base = e.needs_base || pe.needs_base;
  }
  return e;
}

}  // namespace

DeltaInspection inspect_delta(const fs::path& dir) {
  // Everything delta-apply checks of the delta itself, by the same reader.
  const OpenDelta v = open_delta(dir);
  const DeltaIndex& idx = v.index;

  DeltaInspection r;
  r.dir = dir;
  r.version = idx.version;
  r.base_version = idx.base_version;
  r.encoding = idx.encoding_name;
  r.checksum_format = idx.checksum_format == ChecksumFormat::adler32 ? "adler32" : "xxh3-128";
  r.format = idx.format_revision;
  r.index_checksum = idx.index_checksum;

  // Every entry decoded in full, as delta-apply decodes it.
  for (const DeltaEntry& de : v.entries)
    r.entries.push_back(about_file(v.path_of(de), [&] { return inspect_entry(v, de); }));
  std::sort(r.entries.begin(), r.entries.end(),
            [](const InspectEntry& a, const InspectEntry& b) { return a.tensor < b.tensor; });

  for (const auto& fc : idx.files) {
    r.files.push_back({fc.path, fc.op, fc.size, fc.hash});
    if (fc.op == FileChange::Op::put) {
      ++r.files_put;
      r.file_bytes += fc.size;
    } else {
      ++r.files_removed;
    }
  }

  // Weight-file operations (their new headers checked by open_delta).
  for (const ShardOp& so : idx.shards) {
    InspectShard sh;
    sh.file = so.file;
    sh.op = so.op;
    if (so.op == ShardOp::Op::remove) {
      ++r.shards_removed;
      r.shards.push_back(std::move(sh));
      continue;
    }
    sh.header_bytes = so.header_size;
    if (so.op == ShardOp::Op::header) {
      ++r.shards_rewritten;
      r.shards.push_back(std::move(sh));
      continue;
    }
    for (const ShardOp::Tensor& t : so.tensors) ++(!t.from ? sh.fresh : *t.from == t.name ? sh.copied : sh.renamed);
    sh.size = so.size;
    sh.tensors = so.tensors.size();
    ++r.shards_built;
    r.shards.push_back(std::move(sh));
  }

  for (const auto& e : r.entries) {
    r.entry_bytes += e.entry_bytes;
    if (e.tensor_bytes) r.tensor_bytes += *e.tensor_bytes;
    if (e.changed_elements) r.changed_elements += *e.changed_elements;
    if (e.changed_bytes) r.changed_bytes += *e.changed_bytes;
    ++r.entries_by_encoding[e.encoding];
  }
  r.delta_bytes = tree_bytes(dir);
  return r;
}

json inspection_json(const DeltaInspection& d) {
  auto opt = [](const std::optional<std::uint64_t>& v) { return v ? json(*v) : json(nullptr); };
  json tensors = json::array();
  bool all_lengths = true;
  for (const auto& e : d.entries) {
    all_lengths = all_lengths && e.tensor_bytes.has_value();
    tensors.push_back({{"name", e.tensor},
                       {"file", e.file},
                       {"encoding", std::string(encoding_name(e.encoding))},
                       {"entry_bytes", e.entry_bytes},
                       {"tensor_bytes", opt(e.tensor_bytes)},
                       {"element_size", opt(e.element_size)},
                       {"changed_elements", opt(e.changed_elements)},
                       {"changed_bytes", opt(e.changed_bytes)},
                       {"checksum", e.checksum_hex()},
                       {"base_checksum", e.base_checksum ? json(e.base_checksum->hex()) : json(nullptr)},
                       {"stack_parts", e.pieces ? json(e.pieces) : json(nullptr)},
                       {"needs_base", e.needs_base}});
  }
  json files = json::array();
  for (const auto& f : d.files) {
    const bool put = f.op == FileChange::Op::put;
    files.push_back({{"path", f.path},
                     {"op", put ? "put" : "remove"},
                     {"size", put ? json(f.size) : json(nullptr)},
                     {"checksum", put ? json(f.checksum.hex()) : json(nullptr)}});
  }
  json shards = json::array();
  for (const auto& s : d.shards) {
    const char* op = s.op == ShardOp::Op::remove ? "remove" : s.op == ShardOp::Op::header ? "header" : "build";
    json o = {{"file", s.file}, {"op", op}};
    if (s.op != ShardOp::Op::remove) o["header_bytes"] = s.header_bytes;
    if (s.op == ShardOp::Op::build) {
      o["size"] = s.size;
      o["tensors"] = s.tensors;
      o["copied"] = s.copied;
      o["renamed"] = s.renamed;
      o["new"] = s.fresh;
    }
    shards.push_back(std::move(o));
  }
  json entries_json = json::object();  // every encoding, by its name
  for (const EncodingInfo& enc : kEncodings) entries_json[std::string(enc.name)] = d.entries_by_encoding[enc.encoding];
  return {{"delta", d.dir.string()},
          {"version", format_version(d.version)},
          {"base_version", format_version(d.base_version)},
          {"format", opt(d.format)},
          {"encoding", d.encoding},
          {"checksum_format", d.checksum_format},
          {"index_checksum", d.index_checksum ? json(d.index_checksum->hex()) : json(nullptr)},
          {"tensors", std::move(tensors)},
          {"files", std::move(files)},
          {"weight_files", std::move(shards)},
          {"totals",
           {{"tensors", d.entries.size()},
            {"entries", entries_json},
            {"entry_bytes", d.entry_bytes},
            // A sum over some entries only would read as the whole: null instead.
            {"tensor_bytes", all_lengths ? json(d.tensor_bytes) : json(nullptr)},
            {"changed_elements", d.changed_elements},
            {"changed_bytes", d.changed_bytes},
            {"files_put", d.files_put},
            {"files_removed", d.files_removed},
            {"weight_files_built", d.shards_built},
            {"headers_rewritten", d.shards_rewritten},
            {"weight_files_removed", d.shards_removed},
            {"file_bytes", d.file_bytes},
            {"delta_bytes", d.delta_bytes}}}};
}

}  // namespace hfdelta
