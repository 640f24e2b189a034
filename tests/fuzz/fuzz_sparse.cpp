// Fuzz target: the "sparse" delta decoder on an untrusted entry.
//
// Input: 4 bytes, little-endian, giving the tensor size (folded to at most
// 2 MiB + 16: chunks have 2^20 elements, so 1- and 2-byte elements reach a
// second and third chunk), then the entry. Every changed element handed out must be a whole
// element inside the tensor, in strictly ascending order. The result is held
// against a second, independent reading of the entry layout (see
// decode_sparse in src/codec.cpp) built on zstd's one-shot API: both must
// accept the same entries, produce the same changes and agree on what the
// values mean ("HFS1": XOR, "HFS2": zigzag of the difference). Each value is
// also applied by sparse_apply_value and by a bytewise reference.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "codec/codec.hpp"
#include "fuzz_check.hpp"
#include "hfdelta/error.hpp"
#include "zstd_ref.hpp"

namespace {

using fuzz::le;

struct Changes {
  std::optional<hfdelta::SparseOp> op;  // what the values mean, from the magic
  std::size_t elem_size = 0;
  std::vector<std::uint64_t> offsets;  // byte offsets of changed elements
  std::vector<std::uint8_t> xors;      // the stored values, elem_size bytes each
};

// Three chunks of 1-byte elements, the last partial; two of 2-byte ones.
constexpr std::uint64_t kMaxSparseTensor = 2 * hfdelta::kSparseChunkElements + 16;

enum class Verdict { accept, refuse, no_opinion };

// The reference reading. Layout, little-endian:
//   "HFS1" or "HFS2" | u32 elem_size | u64 nbytes | u64 chunk_elements | u64 chunks
//   then per chunk: u64 K | u64 gaps_len | elem_size x u64 plane_len
//                   | gaps frame (K varints) | elem_size plane frames (K bytes each)
Verdict reference(std::span<const std::uint8_t> e, std::uint64_t nbytes, Changes& out) {
  std::uint64_t at = 0;
  auto take = [&](std::uint64_t k) -> const std::uint8_t* {
    if (k > e.size() - at) return nullptr;
    const std::uint8_t* p = e.data() + at;
    at += k;
    return p;
  };
  const std::uint8_t* h = take(32);
  if (!h) return Verdict::refuse;
  if (std::memcmp(h, "HFS1", 4) == 0)
    out.op = hfdelta::SparseOp::xor_bytes;
  else if (std::memcmp(h, "HFS2", 4) == 0)
    out.op = hfdelta::SparseOp::add_zigzag;
  else
    return Verdict::refuse;
  const std::uint64_t es = le(h + 4, 4);
  if ((es != 1 && es != 2 && es != 4 && es != 8) || nbytes % es != 0) return Verdict::refuse;
  if (le(h + 8, 8) != nbytes) return Verdict::refuse;
  const std::uint64_t n = nbytes / es, per_chunk = le(h + 16, 8), chunks = le(h + 24, 8);
  // Exactly ceil(n / per_chunk) chunks, computed without overflow.
  if (per_chunk != hfdelta::kSparseChunkElements) return Verdict::refuse;  // fixed by format revision 2
  if (chunks != (n == 0 ? 0 : (n - 1) / per_chunk + 1)) return Verdict::refuse;
  out.elem_size = es;

  for (std::uint64_t ch = 0; ch < chunks; ++ch) {
    const std::uint64_t e0 = ch * per_chunk;
    const std::uint64_t e1 = per_chunk > n - e0 ? n : e0 + per_chunk;
    const std::uint8_t* head = take(16 + 8 * es);
    if (!head) return Verdict::refuse;
    const std::uint64_t k = le(head, 8);
    if (k > e1 - e0) return Verdict::refuse;
    std::span<const std::uint8_t> frames[9];
    for (std::uint64_t f = 0; f <= es; ++f) {
      const std::uint64_t len = le(head + 8 + 8 * f, 8);
      const std::uint8_t* p = take(len);
      if (!p) return Verdict::refuse;
      frames[f] = {p, static_cast<std::size_t>(len)};
      if (fuzz::is_legacy_frame(frames[f])) return Verdict::no_opinion;
    }
    // A varint is at most 10 bytes, so the positions take at most 10 K bytes.
    const auto gaps = fuzz::zstd_one_frame(frames[0], static_cast<std::size_t>(10 * k));
    if (!gaps) return Verdict::refuse;
    std::vector<std::vector<std::uint8_t>> planes;
    for (std::uint64_t b = 0; b < es; ++b) {
      auto p = fuzz::zstd_one_frame(frames[1 + b], static_cast<std::size_t>(k));
      if (!p || p->size() != k) return Verdict::refuse;
      planes.push_back(std::move(*p));
    }
    std::size_t g = 0;
    std::uint64_t next = e0;
    for (std::uint64_t i = 0; i < k; ++i) {
      // LEB128, at most 10 bytes; bits past the 64th are dropped, as the
      // library's decoder does.
      std::uint64_t v = 0;
      for (int shift = 0;; shift += 7) {
        if (shift > 63 || g == gaps->size()) return Verdict::refuse;
        const std::uint8_t byte = (*gaps)[g++];
        v |= std::uint64_t(byte & 0x7f) << shift;
        if (!(byte & 0x80)) break;
      }
      if (v >= e1 - next) return Verdict::refuse;
      const std::uint64_t el = next + v;
      out.offsets.push_back(el * es);
      for (std::uint64_t b = 0; b < es; ++b) out.xors.push_back(planes[b][i]);
      next = el + 1;
    }
    if (g != gaps->size()) return Verdict::refuse;
  }
  return at == e.size() ? Verdict::accept : Verdict::refuse;
}

// One value applied to one element, byte by byte: XOR, or for zigzag the
// magnitude m = v >> 1 added (v even) or m + 1 subtracted (v odd), the
// carry or borrow dropped past the element's last byte.
void reference_apply(std::uint8_t* elem, const std::uint8_t* v, std::size_t es, hfdelta::SparseOp op) {
  if (op == hfdelta::SparseOp::xor_bytes) {
    for (std::size_t k = 0; k < es; ++k) elem[k] ^= v[k];
    return;
  }
  std::uint8_t m[8];
  for (std::size_t k = 0; k < es; ++k) m[k] = static_cast<std::uint8_t>(v[k] >> 1 | (k + 1 < es ? v[k + 1] << 7 : 0));
  if (!(v[0] & 1)) {
    unsigned carry = 0;
    for (std::size_t k = 0; k < es; ++k) {
      const unsigned sum = elem[k] + m[k] + carry;
      elem[k] = static_cast<std::uint8_t>(sum);
      carry = sum >> 8;
    }
  } else {
    int borrow = 1;  // the + 1
    for (std::size_t k = 0; k < es; ++k) {
      const int diff = int(elem[k]) - int(m[k]) - borrow;
      elem[k] = static_cast<std::uint8_t>(diff);
      borrow = diff < 0;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::uint64_t nbytes = fuzz::tensor_size(data, size, kMaxSparseTensor);
  const std::span<const std::uint8_t> entry =
      size >= 4 ? std::span(data + 4, size - 4) : std::span<const std::uint8_t>();

  Changes got;
  bool ok = true;
  try {
    hfdelta::decode_sparse(entry, nbytes, "fuzz",
                           [&](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> xors, std::size_t es,
                               hfdelta::SparseOp op) {
                             FUZZ_CHECK(es == 1 || es == 2 || es == 4 || es == 8);
                             FUZZ_CHECK(op == hfdelta::SparseOp::xor_bytes || op == hfdelta::SparseOp::add_zigzag);
                             FUZZ_CHECK(!got.op || *got.op == op);  // one meaning per entry
                             got.op = op;
                             FUZZ_CHECK(got.elem_size == 0 || got.elem_size == es);
                             got.elem_size = es;
                             FUZZ_CHECK(!offs.empty());
                             FUZZ_CHECK(xors.size() == offs.size() * es);
                             for (const std::uint64_t o : offs) {
                               FUZZ_CHECK(o % es == 0);
                               FUZZ_CHECK(o < nbytes && es <= nbytes - o);
                               FUZZ_CHECK(got.offsets.empty() || o > got.offsets.back());
                               got.offsets.push_back(o);
                             }
                             got.xors.insert(got.xors.end(), xors.begin(), xors.end());
                           });
  } catch (const hfdelta::Error& e) {
    FUZZ_CHECK(e.code() == hfdelta::Exit::bad_input);
    ok = false;
  }

  Changes want;
  const Verdict v = reference(entry, nbytes, want);
  if (v == Verdict::no_opinion) return 0;
  if (ok) {
    FUZZ_CHECK(v == Verdict::accept);
    FUZZ_CHECK(got.offsets == want.offsets);
    FUZZ_CHECK(got.xors == want.xors);
    FUZZ_CHECK(got.offsets.empty() || got.elem_size == want.elem_size);
    FUZZ_CHECK(got.offsets.empty() || got.op == want.op);  // the decoder names the op the magic says
    // The library's apply against the bytewise reference, on an element
    // made from its offset.
    for (std::size_t i = 0; i < got.offsets.size(); ++i) {
      const std::size_t es = got.elem_size;
      std::uint8_t lib[8], ref[8];
      for (std::size_t k = 0; k < es; ++k) lib[k] = ref[k] = static_cast<std::uint8_t>(got.offsets[i] * 31 + k * 97);
      hfdelta::sparse_apply_value(lib, got.xors.data() + i * es, es, *got.op);
      reference_apply(ref, got.xors.data() + i * es, es, *got.op);
      FUZZ_CHECK(std::memcmp(lib, ref, es) == 0);
    }
  } else {
    FUZZ_CHECK(v == Verdict::refuse);
  }
  return 0;
}
