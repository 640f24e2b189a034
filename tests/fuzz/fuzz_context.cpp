// Fuzz target: the "context" delta decoder on an untrusted entry, against a
// base.
//
// Input (see context_base.hpp): 4 bytes, little-endian, the tensor size
// (folded to at most 2 MiB + 16), a byte choosing the base (zeros,
// weight-like, noise, or a tile of the input's own bytes), then the entry.
//
// decode_context may only ask for whole elements of the base, front to back,
// at most kContextWindow bytes and one chunk at a time, and every change it
// hands out must be a whole element, nonzero, in strictly ascending order and
// inside the piece it asked for last. Refusals must be Error(bad_input) for
// a damaged entry, or Error(verify_failed) for one that does not fit its
// base. check_context, which reads no base, must refuse whatever the decoder
// refuses except for a base that does not fit (and then the decoder must say
// verify_failed). Decoding no chunk reads no base and refuses only what
// check_context refuses; decoding chunk by chunk gives the changes of the
// whole.
//
// Round trips through the encoder: the base with the decoded changes applied,
// encoded against the base (by ContextChunkEncoder, each chunk scanned in two
// pieces as the diff engine scans windows, and by encode_context: the same
// bytes) and decoded again, gives the same bytes. Where the entry is refused
// (and the tensor is small), the entry's bytes are read as edits of the base
// instead, and its head as the element size and context field (replaced, as
// encode_context replaces them, where they do not fit).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "codec/codec.hpp"
#include "codec/codec_internal.hpp"
#include "context_base.hpp"
#include "fuzz_check.hpp"
#include "hfdelta/error.hpp"

namespace {

using Bytes = std::vector<std::uint8_t>;

constexpr std::uint64_t kWhole = ~0ull;               // decode_context: every chunk
constexpr std::uint64_t kMaxEditedTensor = 1u << 18;  // the round trip of edits: small tensors only

struct Decoded {
  bool ok = true;
  hfdelta::Exit code = hfdelta::Exit::ok;
  std::string error;
  bool asked = false;  // for any base
  std::size_t es = 0;  // of the changes
  std::vector<std::uint64_t> offs;
  Bytes vals;
};

// Decodes chunks [first, last) of `entry` (all of them: decode_context)
// against the base `in` names, checking each piece asked for and each change.
Decoded decode(std::span<const std::uint8_t> entry, const fuzz::ContextInput& in, std::uint64_t first,
               std::uint64_t last) {
  static Bytes piece(hfdelta::kContextWindow);
  const std::uint64_t nbytes = in.nbytes;
  Decoded d;
  std::uint64_t piece_at = 0, piece_end = 0, es = 0;
  const hfdelta::BaseView base = [&](std::uint64_t off, std::size_t n) {
    // Asked only once the head is read: its element size is the entry's.
    FUZZ_CHECK(entry.size() >= hfdelta::kContextHeadSize);
    es = fuzz::le(entry.data() + 4, 4);
    FUZZ_CHECK(es == 1 || es == 2 || es == 4 || es == 8);
    FUZZ_CHECK(n > 0 && n <= hfdelta::kContextWindow && n % es == 0 && off % es == 0);
    FUZZ_CHECK(off <= nbytes && n <= nbytes - off);
    FUZZ_CHECK(!d.asked || off >= piece_end);  // front to back
    const std::uint64_t chunk_bytes = hfdelta::kContextChunkElements * es;
    FUZZ_CHECK(off / chunk_bytes == (off + n - 1) / chunk_bytes);  // never across a chunk
    FUZZ_CHECK(off / chunk_bytes >= first && off / chunk_bytes < last);
    d.asked = true;
    piece_at = off;
    piece_end = off + n;
    fuzz::context_base(in, off, piece.data(), n);
    return std::span<const std::uint8_t>(piece.data(), n);
  };
  const hfdelta::SparsePatch patch = [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> vals,
                                         std::size_t e, hfdelta::SparseOp op) {
    FUZZ_CHECK(d.asked && e == es);
    FUZZ_CHECK(op == hfdelta::SparseOp::add_zigzag);
    FUZZ_CHECK(!offs.empty() && vals.size() == offs.size() * e);
    for (std::size_t i = 0; i < offs.size(); ++i) {
      const std::uint64_t o = offs[i];
      FUZZ_CHECK(o % e == 0 && o >= piece_at && o < piece_end && e <= piece_end - o);
      FUZZ_CHECK(d.offs.empty() || o > d.offs.back());
      bool nonzero = false;  // zigzag of a difference of at least 1
      for (std::size_t k = 0; k < e; ++k) nonzero = nonzero || vals[i * e + k] != 0;
      FUZZ_CHECK(nonzero);
      d.offs.push_back(o);
    }
    d.es = e;
    d.vals.insert(d.vals.end(), vals.begin(), vals.end());
  };
  try {
    if (first == 0 && last == kWhole)
      hfdelta::decode_context(entry, nbytes, "fuzz", base, patch);
    else
      hfdelta::decode_context_chunks(entry, nbytes, first, last, "fuzz", base, patch);
  } catch (const hfdelta::Error& e) {
    // A damaged entry, or (verify_failed) one that does not fit the base.
    FUZZ_CHECK(e.code() == hfdelta::Exit::bad_input || e.code() == hfdelta::Exit::verify_failed);
    d.ok = false;
    d.code = e.code();
    d.error = e.what();
    FUZZ_CHECK(d.code == hfdelta::Exit::bad_input || d.error.find("not the entry's base") != std::string::npos);
  }
  return d;
}

Bytes applied(const Bytes& base, const Decoded& d) {
  Bytes out = base;
  for (std::size_t i = 0; i < d.offs.size(); ++i)
    hfdelta::sparse_apply_value(out.data() + d.offs[i], d.vals.data() + i * d.es, d.es, hfdelta::SparseOp::add_zigzag);
  return out;
}

// The entry of `next` over `base` from the chunk encoder, driven as the diff
// engine drives it: the head, then each chunk scanned in two pieces (split
// `cut` elements in, modulo its length) and ended. One encoder for all runs:
// it holds buffers of a chunk's size, which would cost more to allocate for
// each run than the rest of the run.
Bytes chunk_encode(const Bytes& base, const Bytes& next, std::size_t es, hfdelta::ContextField f, std::uint64_t cut) {
  static hfdelta::Compressor c(1);
  static hfdelta::ContextChunkEncoder enc;
  Bytes e(hfdelta::kContextHeadSize);
  hfdelta::context_entry_head(es, next.size(), f, e.data());
  const hfdelta::ByteSink sink = [&](std::span<const std::uint8_t> s) { e.insert(e.end(), s.begin(), s.end()); };
  const std::uint64_t n = next.size() / es;
  for (std::uint64_t e0 = 0; e0 < n; e0 += hfdelta::kContextChunkElements) {
    const std::uint64_t len = std::min<std::uint64_t>(n - e0, hfdelta::kContextChunkElements);
    const std::uint64_t k = cut % (len + 1);
    enc.begin(es, f);
    const std::uint8_t *a = base.data() + e0 * es, *b = next.data() + e0 * es;
    if (k) enc.scan(a, b, static_cast<std::size_t>(k), 0);
    if (k < len) enc.scan(a + k * es, b + k * es, static_cast<std::size_t>(len - k), k);
    const std::size_t before = e.size();
    FUZZ_CHECK(enc.end(c, sink) == e.size() - before);
  }
  return e;
}

// `next` encoded against `base` (by encode_context too where `api`: the same
// bytes), then check_context and decode_context of the entry: accepted, the
// changes counted, and `next` again.
void round_trip(const fuzz::ContextInput& in, const Bytes& base, const Bytes& next, std::size_t es,
                hfdelta::ContextField field, std::uint64_t cut, bool api) {
  const Bytes e = chunk_encode(base, next, es, field, cut);
  if (api) {
    static hfdelta::Compressor c(1);
    Bytes e2;
    const std::uint64_t n = hfdelta::encode_context(
        c, base, next, es, field, [&](std::span<const std::uint8_t> s) { e2.insert(e2.end(), s.begin(), s.end()); });
    FUZZ_CHECK(n == e2.size());
    FUZZ_CHECK(e2 == e);
  }
  std::optional<hfdelta::ContextSummary> sum;
  try {
    sum = hfdelta::check_context(e, in.nbytes, "fuzz round trip");
  } catch (const hfdelta::Error&) {}
  FUZZ_CHECK(sum);  // the encoder's own entry
  FUZZ_CHECK(sum->changes == hfdelta::count_changes(base, next, sum->elem_size).elements);
  const Decoded d = decode(e, in, 0, kWhole);
  FUZZ_CHECK(d.ok);
  FUZZ_CHECK(d.offs.size() == sum->changes);
  FUZZ_CHECK(applied(base, d) == next);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fuzz::ContextInput in = fuzz::context_input(data, size);
  const std::span<const std::uint8_t> entry = in.entry;

  const Decoded got = decode(entry, in, 0, kWhole);
  std::optional<hfdelta::ContextSummary> sum;
  try {
    sum = hfdelta::check_context(entry, in.nbytes, "fuzz");
  } catch (const hfdelta::Error& e) {
    FUZZ_CHECK(e.code() == hfdelta::Exit::bad_input);
  }
  if (!sum) {
    FUZZ_CHECK(!got.ok);  // what check_context refuses, the decoder refuses
  } else if (!got.ok) {
    // The entry is sound by itself: only a base that does not fit can be wrong.
    FUZZ_CHECK(got.code == hfdelta::Exit::verify_failed);
  } else {
    FUZZ_CHECK(sum->changes == got.offs.size());
    FUZZ_CHECK(sum->elem_size == fuzz::le(entry.data() + 4, 4));
    FUZZ_CHECK(sum->chunks == hfdelta::sparse_chunk_count(in.nbytes, sum->elem_size));
    FUZZ_CHECK(got.offs.empty() || got.es == sum->elem_size);
  }

  // No chunk of the entry: its head and chunk layout only, no base.
  const Decoded none = decode(entry, in, 0, 0);
  FUZZ_CHECK(!none.asked && none.offs.empty());
  FUZZ_CHECK(none.ok || (!sum && none.code == hfdelta::Exit::bad_input));

  if (got.ok && sum && sum->chunks > 1) {
    // Chunk by chunk, as a parallel apply decodes it: the same changes.
    Decoded all;
    for (std::uint64_t ch = 0; ch < sum->chunks; ++ch) {
      const Decoded part = decode(entry, in, ch, ch + 1);
      FUZZ_CHECK(part.ok);
      all.offs.insert(all.offs.end(), part.offs.begin(), part.offs.end());
      all.vals.insert(all.vals.end(), part.vals.begin(), part.vals.end());
    }
    FUZZ_CHECK(all.offs == got.offs && all.vals == got.vals);
  }

  if (got.ok) {
    const Bytes base = fuzz::context_base(in);
    const Bytes next = applied(base, got);
    FUZZ_CHECK(hfdelta::count_changes(base, next, sum->elem_size).elements == got.offs.size());
    round_trip(in, base, next, sum->elem_size, {entry[32], entry[33]}, in.seed * 977u + entry.size(), true);
  } else if (in.nbytes <= kMaxEditedTensor) {
    // The entry's bytes as edits instead: byte pairs (step, XOR value), steps
    // of up to 127 bytes or of 1 KiB multiples; the head's element size and
    // field, whatever they say.
    const Bytes base = fuzz::context_base(in);
    Bytes next = base;
    const std::size_t skip = entry.size() >= hfdelta::kContextHeadSize ? hfdelta::kContextHeadSize : 0;
    std::uint64_t pos = 0;
    for (std::size_t i = skip; i + 1 < entry.size(); i += 2) {
      pos += entry[i] < 128 ? entry[i] : std::uint64_t(entry[i] - 127) * 1024;
      if (pos >= next.size()) break;
      next[static_cast<std::size_t>(pos)] ^= entry[i + 1];
    }
    // (An element size and field that do not fit are replaced as
    // encode_context replaces them.)
    const std::size_t es = hfdelta::sparse_elem_size(entry.size() >= 8 ? fuzz::le(entry.data() + 4, 4) : 2, in.nbytes);
    hfdelta::ContextField field =
        entry.size() >= 34 ? hfdelta::ContextField{entry[32], entry[33]} : hfdelta::context_field("BF16", 2);
    if (field.bits > 8 || field.shift + field.bits > 8 * es) field = {};
    round_trip(in, base, next, es, field, entry.size(), false);
  }
  return 0;
}
