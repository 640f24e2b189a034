#include "codec/codec.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>

#include <zstd.h>

#if defined(__x86_64__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "codec/codec_internal.hpp"
#include "hfdelta/error.hpp"

namespace hfdelta {

namespace {

// Work in pieces this size: big enough to amortise calls, small enough to stay
// in cache and keep memory flat whatever the tensor size.
constexpr std::size_t kChunk = 256 * 1024;

[[noreturn]] void zstd_fail(const char* op, std::size_t code) {
  fail(Exit::failure, std::string("zstd ") + op + ": " + ZSTD_getErrorName(code));
}

}  // namespace

void check_declared_size(std::span<const std::uint8_t> frame, std::uint64_t expect, const std::string& what) {
  const unsigned long long cs = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (cs == ZSTD_CONTENTSIZE_ERROR) fail(Exit::bad_input, what + ": not a zstd frame");
  if (cs != ZSTD_CONTENTSIZE_UNKNOWN && cs != expect)
    fail(Exit::bad_input,
         what + ": zstd frame declares " + std::to_string(cs) + " bytes, expected " + std::to_string(expect));
}

ChangeCount count_changes(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b, std::size_t es) {
  ChangeCount c;
  const std::size_t n = std::min(a.size(), b.size());
  if (es == 0) es = 1;
  // Skip equal 64-byte blocks fast (the common case), look at elements only
  // inside blocks that differ. 64 is a multiple of every element size.
  constexpr std::size_t kBlock = 64;
  std::size_t i = 0;
  if (kBlock % es != 0) es = 1;  // dtypes have 1, 2, 4 or 8 bytes; anything else is counted bytewise
  for (; i + kBlock <= n; i += kBlock) {
    if (std::memcmp(a.data() + i, b.data() + i, kBlock) == 0) continue;
    for (std::size_t e = i; e < i + kBlock; e += es) {
      std::size_t diff = 0;
      for (std::size_t k = 0; k < es; ++k) diff += a[e + k] != b[e + k];
      c.bytes += diff;
      c.elements += diff != 0;
    }
  }
  for (std::size_t e = i; e < n; e += es) {
    std::size_t diff = 0;
    for (std::size_t k = 0; k < es && e + k < n; ++k) diff += a[e + k] != b[e + k];
    c.bytes += diff;
    c.elements += diff != 0;
  }
  return c;
}

// ---- Compressor ---------------------------------------------------------------

Compressor::Compressor(int level) : cctx_(ZSTD_createCCtx()), level_(level), out_(ZSTD_CStreamOutSize()) {
  if (!cctx_) fail(Exit::failure, "zstd: cannot create a compression context");
}

Compressor::~Compressor() { ZSTD_freeCCtx(cctx_); }

int frame_level(int level, FrameKind kind) {
  if (level != kDefaultLevel) return level;
  return kind == FrameKind::slime ? 1 : 3;
}

void Compressor::begin(std::uint64_t pledged, FrameKind kind) {
  ZSTD_CCtx* c = cctx_;
  const bool slime = kind == FrameKind::slime;
  ZSTD_CCtx_reset(c, ZSTD_reset_session_only);
  if (auto r = ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, frame_level(level_, kind)); ZSTD_isError(r))
    zstd_fail("level", r);
  if (auto r = ZSTD_CCtx_setParameter(c, ZSTD_c_minMatch, 0); ZSTD_isError(r)) zstd_fail("min match", r);
  // 0: the level's own window.
  if (auto r = ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, slime ? 17 : 0); ZSTD_isError(r)) zstd_fail("window", r);
  // A frame checksum lets any zstd reader notice a damaged frame of ours by
  // itself; a slime-layout entry has its tensor's checksum instead, which
  // every reader of the layout checks, and decodes faster without it.
  if (auto r = ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, slime ? 0 : 1); ZSTD_isError(r)) zstd_fail("checksum", r);
  if (auto r = ZSTD_CCtx_setPledgedSrcSize(c, pledged); ZSTD_isError(r)) zstd_fail("pledged size", r);
}

void Compressor::put(std::span<const std::uint8_t> in, const ByteSink& sink) {
  ZSTD_CCtx* c = cctx_;
  ZSTD_inBuffer ib{in.data(), in.size(), 0};
  while (ib.pos < ib.size) {
    ZSTD_outBuffer ob{out_.data(), out_.size(), 0};
    const std::size_t r = ZSTD_compressStream2(c, &ob, &ib, ZSTD_e_continue);
    if (ZSTD_isError(r)) zstd_fail("compress", r);
    if (ob.pos) sink({out_.data(), ob.pos});
  }
}

// Hands out what zstd holds back until it says nothing is left: `flush`
// keeps the frame open, `end` closes it.
static void drain(ZSTD_CCtx* c, std::vector<std::uint8_t>& out, ZSTD_EndDirective how, const ByteSink& sink) {
  ZSTD_inBuffer ib{nullptr, 0, 0};
  std::size_t r;
  do {
    ZSTD_outBuffer ob{out.data(), out.size(), 0};
    r = ZSTD_compressStream2(c, &ob, &ib, how);
    if (ZSTD_isError(r)) zstd_fail(how == ZSTD_e_flush ? "flush" : "compress", r);
    if (ob.pos) sink({out.data(), ob.pos});
  } while (r != 0);
}

void Compressor::flush(const ByteSink& sink) { drain(cctx_, out_, ZSTD_e_flush, sink); }

void Compressor::end(const ByteSink& sink) { drain(cctx_, out_, ZSTD_e_end, sink); }

void Compressor::compress_frame(std::span<const std::uint8_t> in, std::vector<std::uint8_t>& out, bool literals) {
  ZSTD_CCtx* c = cctx_;
  begin(in.size());
  // Only the longest matches (7, zstd's most): on symbols without repeats, zstd's shorter
  // matches cost more than the Huffman-coded literals they replace.
  if (literals)
    if (auto r = ZSTD_CCtx_setParameter(c, ZSTD_c_minMatch, 7); ZSTD_isError(r)) zstd_fail("min match", r);
  const std::size_t at = out.size();
  out.resize(at + ZSTD_compressBound(in.size()));
  const std::size_t r = ZSTD_compress2(c, out.data() + at, out.size() - at, in.data(), in.size());
  if (ZSTD_isError(r)) zstd_fail("compress", r);
  out.resize(at + r);
}

std::uint64_t encode_xor(Compressor& c, std::span<const std::uint8_t> a, std::span<const std::uint8_t> b,
                         const ByteSink& sink) {
  std::uint64_t frame = 0;
  const ByteSink counted = [&](std::span<const std::uint8_t> s) {
    frame += s.size();
    sink(s);
  };
  std::vector<std::uint8_t> buf(kChunk);
  c.begin(b.size(), FrameKind::slime);
  for (std::size_t off = 0; off < b.size(); off += kChunk) {
    const std::size_t k = std::min(kChunk, b.size() - off);
    for (std::size_t i = 0; i < k; ++i) buf[i] = a[off + i] ^ b[off + i];
    c.put({buf.data(), k}, counted);
  }
  c.end(counted);
  return frame;
}

std::uint64_t encode_overwrite(Compressor& c, std::span<const std::uint8_t> a, std::span<const std::uint8_t> b,
                               std::uint64_t changed, const ByteSink& sink) {
  if (b.size() > 0xffffffffull)
    fail(Exit::unsupported, "overwrite encoding stores 32-bit positions; a tensor of " + std::to_string(b.size()) +
                                " bytes needs the xor encoding");
  std::uint64_t frame = 0;
  const ByteSink counted = [&](std::span<const std::uint8_t> s) {
    frame += s.size();
    sink(s);
  };
  std::vector<std::uint8_t> buf(kChunk);
  c.begin(4 + 5 * changed, FrameKind::slime);
  put_le32(buf.data(), static_cast<std::uint32_t>(changed));
  c.put({buf.data(), 4}, counted);
  // Two passes over the views: positions first, then the values, as the format lays them out.
  std::size_t fill = 0;
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (a[i] == b[i]) continue;
    put_le32(buf.data() + fill, static_cast<std::uint32_t>(i));
    fill += 4;
    ++seen;
    if (fill + 4 > buf.size()) c.put({buf.data(), fill}, counted), fill = 0;
  }
  // The values start a block of their own: a block mixing positions and
  // values codes both worse (0.9-1.2% on training steps).
  if (fill) c.put({buf.data(), fill}, counted), fill = 0;
  c.flush(counted);
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (a[i] == b[i]) continue;
    buf[fill++] = b[i];
    if (fill == buf.size()) c.put({buf.data(), fill}, counted), fill = 0;
  }
  if (fill) c.put({buf.data(), fill}, counted);
  if (seen != changed) fail(Exit::failure, "overwrite encoder: changed byte count does not match its input");
  c.end(counted);
  return frame;
}

// ---- FrameReader ---------------------------------------------------------------

FrameReader::FrameReader(Decompressor& d, std::span<const std::uint8_t> frame, const std::string& what)
    : dctx_(d.dctx_), what_(what), buf_(d.buffer()) {
  in_data_ = frame.data();
  in_size_ = frame.size();
  // Only the current frame format: libzstd also decodes pre-1.0 frames and
  // skippable frames, whose edge cases differ between its decoders.
  if (frame.size() < 4 || get_le32(frame.data()) != 0xFD2FB528u) bad("is not a zstd frame");
  ZSTD_DCtx_reset(dctx_, ZSTD_reset_session_only);
}

void FrameReader::read(void* dst, std::size_t n) {
  auto* out = static_cast<std::uint8_t*>(dst);
  while (n > 0) {
    if (avail() == 0 && !refill()) bad("ends early");
    const std::size_t k = std::min(n, avail());
    std::memcpy(out, buf_.data() + pos_, k);
    out += k;
    pos_ += k;
    n -= k;
  }
}

void FrameReader::skip(std::uint64_t n) {
  while (n > 0) {
    if (avail() == 0 && !refill()) bad("ends early");
    const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, avail()));
    pos_ += k;
    n -= k;
  }
}

std::span<const std::uint8_t> FrameReader::next() {
  if (avail() == 0 && !refill()) return {};
  std::span<const std::uint8_t> s(buf_.data() + pos_, avail());
  pos_ = len_;
  return s;
}

void FrameReader::expect_end() {
  if (avail() != 0 || refill()) bad("decodes to more bytes than declared");
}

void FrameReader::bad(const std::string& msg) const { fail(Exit::bad_input, what_ + ": zstd frame " + msg); }

bool FrameReader::refill() {
  pos_ = len_ = 0;
  ZSTD_DCtx* d = dctx_;
  while (!ended_) {
    ZSTD_inBuffer in{in_data_, in_size_, in_pos_};
    ZSTD_outBuffer out{buf_.data(), buf_.size(), 0};
    const std::size_t r = ZSTD_decompressStream(d, &out, &in);
    const bool progressed = in.pos != in_pos_;
    in_pos_ = in.pos;
    if (ZSTD_isError(r)) bad(std::string("is corrupt: ") + ZSTD_getErrorName(r));
    if (r == 0) {
      ended_ = true;
      if (in_pos_ != in_size_) bad("is followed by " + std::to_string(in_size_ - in_pos_) + " extra bytes");
    }
    len_ = out.pos;
    if (len_ > 0) return true;
    if (!ended_ && in_pos_ == in_size_ && !progressed) bad("is truncated");
  }
  return false;
}

// ---- sparse ------------------------------------------------------------------------
//
// Entry layout (little-endian):
//   "HFS2" | u32 elem_size | u64 nbytes | u64 chunk_elements | u64 chunks
//   then per chunk: u64 K | u64 gaps_len | elem_size x u64 plane_len
//                   | gaps frame | plane frames
// The gaps frame holds K varints: the first changed element's index within the
// chunk, then for each next one the distance minus one. Plane b holds byte b
// of each changed element's value (SparseOp). Chunks decode independently.

static_assert(std::endian::native == std::endian::little, "sparse values are read as little-endian integers");

namespace {

constexpr char kMagicXor[4] = {'H', 'F', 'S', '1'};
constexpr std::string_view kMagicAdd = encoding_info(Encoding::sparse).magic;  // what is written

// Bit i of out[k] set where byte i of 64-byte block k of `a` and `b` differ.
void diff_masks_generic(const std::uint8_t* a, const std::uint8_t* b, std::size_t blocks, std::uint64_t* out) {
  for (std::size_t k = 0; k < blocks; ++k, a += 64, b += 64) {
#if defined(__SSE2__)
    std::uint64_t eq = 0;
    for (int i = 0; i < 4; ++i) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16 * i));
      const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * i));
      eq |= static_cast<std::uint64_t>(static_cast<std::uint16_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(x, y)))) << (16 * i);
    }
    out[k] = ~eq;
#else
    std::uint64_t m = 0;
    for (int i = 0; i < 64; ++i) m |= static_cast<std::uint64_t>(a[i] != b[i]) << i;
    out[k] = m;
#endif
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void diff_masks_avx2(const std::uint8_t* a, const std::uint8_t* b, std::size_t blocks,
                                                     std::uint64_t* out) {
  for (std::size_t k = 0; k < blocks; ++k, a += 64, b += 64) {
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
    const __m256i y0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32));
    const __m256i y1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
    const std::uint64_t lo = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(x0, y0)));
    const std::uint64_t hi = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(x1, y1)));
    out[k] = ~(lo | hi << 32);
  }
}
#endif

}  // namespace

// Picked once: the widest byte comparison the CPU has.
void diff_masks(const std::uint8_t* a, const std::uint8_t* b, std::size_t blocks, std::uint64_t* out) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return diff_masks_avx2(a, b, blocks, out);
#endif
  diff_masks_generic(a, b, blocks, out);
}

void EntryCursor::bad(const std::string& msg) const { fail(Exit::bad_input, what + ": " + kind + " " + msg); }

const std::uint8_t* EntryCursor::take(std::uint64_t k) {
  if (k > entry.size() - at) bad("is truncated");
  const std::uint8_t* p = entry.data() + at;
  at += k;
  return p;
}

std::uint64_t EntryCursor::varint() {
  std::uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const std::uint8_t b = byte();
    if (shift == 63 && b > 1) bad("has an overlong number");
    v |= std::uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

std::size_t sparse_elem_size(std::size_t es, std::uint64_t nbytes) { return rules::chunked_elem_size(es, nbytes); }

std::uint64_t sparse_chunk_count(std::uint64_t nbytes, std::size_t es) { return rules::chunk_count(nbytes / es); }

void sparse_entry_head(std::size_t es, std::uint64_t nbytes, std::uint8_t out[kSparseHeadSize]) {
  std::memcpy(out, kMagicAdd.data(), 4);
  put_le32(out + 4, static_cast<std::uint32_t>(es));
  put_le64(out + 8, nbytes);
  put_le64(out + 16, kSparseChunkElements);
  put_le64(out + 24, sparse_chunk_count(nbytes, es));
}

SparseHead read_sparse_head(std::span<const std::uint8_t> entry, const std::string& what) {
  if (entry.size() < kSparseHeadSize) fail(Exit::bad_input, what + ": sparse entry is truncated");
  const std::uint8_t* h = entry.data();
  SparseHead r;
  if (std::memcmp(h, kMagicAdd.data(), 4) == 0)
    r.op = SparseOp::add_zigzag;
  else if (std::memcmp(h, kMagicXor, 4) == 0)
    r.op = SparseOp::xor_bytes;
  else
    fail(Exit::bad_input, what + ": sparse entry does not start with HFS2 or HFS1");
  r.es = get_le32(h + 4);
  r.nbytes = get_le64(h + 8);
  r.chunk_elements = get_le64(h + 16);
  r.chunks = get_le64(h + 24);
  return r;
}

void sparse_apply_value(std::uint8_t* elem, const std::uint8_t* v, std::size_t es, SparseOp op) {
  switch (es) {
    case 1:
      return sparse_apply_value_t<1>(elem, v, op);
    case 2:
      return sparse_apply_value_t<2>(elem, v, op);
    case 4:
      return sparse_apply_value_t<4>(elem, v, op);
    case 8:
      return sparse_apply_value_t<8>(elem, v, op);
  }
  fail(Exit::failure, "sparse: element size " + std::to_string(es));
}

SparseChunkEncoder::SparseChunkEncoder() = default;
SparseChunkEncoder::~SparseChunkEncoder() = default;

void SparseChunkEncoder::begin(std::size_t es) {
  es_ = es;
  count_ = bytes_ = next_ = 0;
  gaps_len_ = 0;
  if (cap_es_ < es) {
    // Uninitialised: pages the chunk never reaches are never touched, so a
    // sparse chunk costs memory in proportion to its changes.
    gaps_.reset(new std::uint8_t[3 * kSparseChunkElements + 1]);  // gaps < 2^20: at most 3 varint bytes
    planes_.reset(new std::uint8_t[es * kSparseChunkElements]);
    cap_es_ = es;
  }
}

template <std::size_t ES>
inline void SparseChunkEncoder::put(std::uint64_t e, std::uint64_t zz) {
  // Gaps inside a chunk are below 2^21: a varint of at most 3 bytes, written
  // without branches as one 4-byte store (the buffer has a byte of slack).
  const std::uint32_t g = static_cast<std::uint32_t>(e - next_);
  const std::uint32_t two = g >= 0x80, three = g >= 0x4000;
  const std::uint32_t v = (g & 0x7f) | two << 7 | ((g >> 7) & 0x7f) << 8 | three << 15 | (g >> 14) << 16;
  std::memcpy(gaps_.get() + gaps_len_, &v, 4);
  gaps_len_ += 1 + two + three;
  next_ = e + 1;
  for (std::size_t k = 0; k < ES; ++k)
    planes_[k * kSparseChunkElements + count_] = static_cast<std::uint8_t>(zz >> (8 * k));
  ++count_;
}

template <std::size_t ES>
inline void SparseChunkEncoder::add(std::uint64_t e, const std::uint8_t* a, const std::uint8_t* b) {
  std::uint64_t va = 0, vb = 0;
  std::memcpy(&va, a, ES);
  std::memcpy(&vb, b, ES);
  bytes_ += rules::changed_bytes(va, vb, ES);
  put<ES>(e, rules::zigzag(rules::difference(va, vb, ES), ES));
}

template <std::size_t ES>
void SparseChunkEncoder::take_t(const FoundChunk& fc) {
  for (std::uint64_t j = 0; j < fc.count; ++j)
    put<ES>(fc.pos[j], rules::zigzag(rules::load_element(fc.diff + j * ES, ES), ES));
  bytes_ += fc.bytes_changed;
}

void SparseChunkEncoder::take(const FoundChunk& fc) {
  if (fc.count > kSparseChunkElements)
    fail(Exit::failure, "sparse encoder: a chunk of " + std::to_string(fc.count) + " changes");
  switch (es_) {
    case 1:
      return take_t<1>(fc);
    case 2:
      return take_t<2>(fc);
    case 4:
      return take_t<4>(fc);
    case 8:
      return take_t<8>(fc);
  }
  fail(Exit::failure, "sparse encoder: element size " + std::to_string(es_));
}

template <std::size_t ES>
void SparseChunkEncoder::scan_t(const std::uint8_t* a, const std::uint8_t* b, std::size_t n, std::uint64_t first) {
  for_each_change<ES>(a, b, n, [&](std::size_t off) { add<ES>(first + off / ES, a + off, b + off); });
}

void SparseChunkEncoder::scan(const std::uint8_t* a, const std::uint8_t* b, std::size_t n, std::uint64_t first) {
  switch (es_) {
    case 1:
      return scan_t<1>(a, b, n, first);
    case 2:
      return scan_t<2>(a, b, n, first);
    case 4:
      return scan_t<4>(a, b, n, first);
    case 8:
      return scan_t<8>(a, b, n, first);
  }
  fail(Exit::failure, "sparse encoder: element size " + std::to_string(es_));
}

std::uint64_t SparseChunkEncoder::end(Compressor& c, const ByteSink& sink) {
  std::uint8_t head[16 + 8 * 8];  // K, gaps length, one length per plane
  const std::size_t head_len = 16 + 8 * es_;
  put_le64(head, count_);
  frames_.clear();
  c.compress_frame({gaps_.get(), gaps_len_}, frames_);
  put_le64(head + 8, frames_.size());
  for (std::size_t k = 0; k < es_; ++k) {
    const std::size_t before = frames_.size();
    c.compress_frame({planes_.get() + k * kSparseChunkElements, static_cast<std::size_t>(count_)}, frames_);
    put_le64(head + 16 + 8 * k, frames_.size() - before);
  }
  sink({head, head_len});
  sink(frames_);
  return head_len + frames_.size();
}

std::uint64_t encode_sparse(Compressor& c, std::span<const std::uint8_t> a, std::span<const std::uint8_t> b,
                            std::size_t es, const ByteSink& sink) {
  es = sparse_elem_size(es, b.size());
  const std::uint64_t n = b.size() / es;
  const std::uint64_t chunks = sparse_chunk_count(b.size(), es);
  std::uint8_t head[kSparseHeadSize];
  sparse_entry_head(es, b.size(), head);
  sink({head, sizeof head});
  std::uint64_t total = sizeof head;
  SparseChunkEncoder enc;
  for (std::uint64_t ch = 0; ch < chunks; ++ch) {
    const std::uint64_t e0 = ch * kSparseChunkElements, e1 = std::min(n, e0 + kSparseChunkElements);
    enc.begin(es);
    enc.scan(a.data() + e0 * es, b.data() + e0 * es, static_cast<std::size_t>(e1 - e0), 0);
    total += enc.end(c, sink);
  }
  return total;
}

std::uint64_t encode_sparse_found(Compressor& c, std::size_t es, std::uint64_t nbytes,
                                  std::span<const FoundChunk> chunks, const ByteSink& sink) {
  if (es != sparse_elem_size(es, nbytes) || chunks.size() != sparse_chunk_count(nbytes, es))
    fail(Exit::failure, "sparse encoder: " + std::to_string(chunks.size()) + " found chunks of " + std::to_string(es) +
                            "-byte elements for a " + std::to_string(nbytes) + "-byte tensor");
  std::uint8_t head[kSparseHeadSize];
  sparse_entry_head(es, nbytes, head);
  sink({head, sizeof head});
  std::uint64_t total = sizeof head;
  SparseChunkEncoder enc;
  for (const FoundChunk& fc : chunks) {
    enc.begin(es);
    enc.take(fc);
    total += enc.end(c, sink);
  }
  return total;
}

void decode_sparse(std::span<const std::uint8_t> entry, std::uint64_t nbytes, const std::string& what,
                   const SparsePatch& patch) {
  decode_sparse_chunks(entry, nbytes, 0, ~0ull, what, patch);
}

namespace {

// The entry's head, taken and checked against a tensor of `nbytes` bytes.
SparseHead take_sparse_head(EntryCursor& in, std::uint64_t nbytes) {
  const SparseHead head = read_sparse_head(in.entry, in.what);
  in.take(kSparseHeadSize);
  const std::uint32_t es = head.es;
  if (es != sparse_elem_size(es, nbytes) || (es != 1 && es != 2 && es != 4 && es != 8))
    in.bad("has element size " + std::to_string(es) + ", which does not fit a " + std::to_string(nbytes) +
           "-byte tensor");
  if (head.nbytes != nbytes)
    in.bad("is for a " + std::to_string(head.nbytes) + "-byte tensor, the target has " + std::to_string(nbytes));
  const std::uint64_t chunk_elems = head.chunk_elements, chunks = head.chunks;
  const std::uint64_t n = nbytes / es;
  // Revision 2 fixes the chunk size; a hostile one could make every element
  // a chunk of its own, or the chunk count wrap around.
  if (chunk_elems != kSparseChunkElements)
    in.bad("has chunks of " + std::to_string(chunk_elems) + " elements, not " + std::to_string(kSparseChunkElements));
  if (chunks != (n == 0 ? 0 : (n - 1) / chunk_elems + 1)) in.bad("has an inconsistent chunk table");
  return head;
}

// One chunk of the entry: elements [e0, e1), `count` of them changed.
struct SparseChunk {
  std::uint64_t index = 0, e0 = 0, e1 = 0, count = 0;
  const std::uint8_t* head = nullptr;  // count, gaps length, one length per plane
  std::span<const std::uint8_t> gaps;  // the gaps frame
  std::uint64_t plane_len(std::uint32_t k) const { return get_le64(head + 16 + 8 * k); }
};

// Takes chunk `ch`'s head and gaps frame; its planes come next.
SparseChunk take_chunk(EntryCursor& in, std::uint64_t ch, std::uint64_t n, std::uint32_t es) {
  SparseChunk c;
  c.index = ch;
  c.e0 = ch * kSparseChunkElements, c.e1 = std::min(n, c.e0 + kSparseChunkElements);
  c.head = in.take(16 + 8 * es);
  c.count = get_le64(c.head);
  if (c.count > c.e1 - c.e0) in.bad("chunk " + std::to_string(ch) + " declares more changes than it has elements");
  const std::uint64_t gaps_len = get_le64(c.head + 8);
  c.gaps = {in.take(gaps_len), gaps_len};
  return c;
}

// The positions of a chunk's changes: LEB128 gaps, read a byte at a time
// from the decoded pieces of the gaps frame.
struct GapReader {
  FrameReader fr;
  std::uint64_t count = 0;
  std::span<const std::uint8_t> piece;
  std::size_t pp = 0;

  std::uint8_t byte() {
    if (pp == piece.size()) {
      piece = fr.next();
      pp = 0;
      if (piece.empty()) fr.bad("ends before its " + std::to_string(count) + " positions");
    }
    return piece[pp++];
  }
  std::uint64_t gap() {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (shift > 63) fr.bad("has an overlong position");
      const std::uint8_t b = byte();
      v |= std::uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  }
};

// Decompression contexts and buffers of one decoding call. The contexts are
// kept per thread: making one costs more than decoding the entry of a small tensor.
struct SparseScratch {
  static constexpr std::size_t kBatch = 16 * 1024;
  std::vector<std::uint64_t> offs;
  std::vector<std::uint8_t> values, plane;
  Decompressor& dg;
  std::vector<std::unique_ptr<Decompressor>>& dp;

  explicit SparseScratch(std::uint32_t es)
      : offs(kBatch), values(kBatch * es), plane(kBatch), dg(gaps_context()), dp(plane_contexts()) {
    while (dp.size() < es) dp.push_back(std::make_unique<Decompressor>());
  }
  static Decompressor& gaps_context() {
    thread_local Decompressor d;
    return d;
  }
  static std::vector<std::unique_ptr<Decompressor>>& plane_contexts() {
    thread_local std::vector<std::unique_ptr<Decompressor>> d;
    return d;
  }
};

// Decodes chunk `c` (its planes next in `in`) and hands its changes to
// `patch` a batch at a time.
void decode_chunk(EntryCursor& in, const SparseChunk& c, std::uint32_t es, SparseOp op, SparseScratch& s,
                  const SparsePatch& patch) {
  const std::string& what = in.what;
  std::optional<FrameReader> pr[8];  // one per plane, in place: no allocation per chunk
  for (std::uint32_t k = 0; k < es; ++k) {
    const std::uint64_t len = c.plane_len(k);
    const std::span<const std::uint8_t> f(in.take(len), len);
    check_declared_size(f, c.count, what);
    pr[k].emplace(*s.dp[k], f, what);
  }
  GapReader gr{FrameReader(s.dg, c.gaps, what), c.count, {}, 0};
  std::uint64_t next = c.e0;
  for (std::uint64_t done = 0; done < c.count;) {
    const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(SparseScratch::kBatch, c.count - done));
    for (std::size_t i = 0; i < m; ++i) {
      const std::uint64_t v = gr.gap();
      if (v >= c.e1 - next) gr.fr.bad("has a position outside chunk " + std::to_string(c.index));
      const std::uint64_t e = next + v;
      s.offs[i] = e * es;
      next = e + 1;
    }
    for (std::uint32_t k = 0; k < es; ++k) {
      pr[k]->read(s.plane.data(), m);
      for (std::size_t i = 0; i < m; ++i) s.values[i * es + k] = s.plane[i];
    }
    patch({s.offs.data(), m}, {s.values.data(), m * es}, es, op);
    done += m;
  }
  if (gr.pp != gr.piece.size()) gr.fr.bad("has bytes after its positions");
  gr.fr.expect_end();
  for (std::uint32_t k = 0; k < es; ++k) pr[k]->expect_end();
}

}  // namespace

void decode_sparse_chunks(std::span<const std::uint8_t> entry, std::uint64_t nbytes, std::uint64_t first,
                          std::uint64_t last, const std::string& what, const SparsePatch& patch) {
  EntryCursor in{entry, what, "sparse entry"};
  const SparseHead head = take_sparse_head(in, nbytes);
  const std::uint32_t es = head.es;
  const std::uint64_t n = nbytes / es;
  SparseScratch scratch(es);
  for (std::uint64_t ch = 0; ch < head.chunks; ++ch) {
    const SparseChunk c = take_chunk(in, ch, n, es);
    if (ch < first || ch >= last) {  // another caller's chunk: step over it
      for (std::uint32_t k = 0; k < es; ++k) in.take(c.plane_len(k));
      continue;
    }
    decode_chunk(in, c, es, head.op, scratch, patch);
  }
  if (in.at != entry.size()) in.bad("is followed by " + std::to_string(entry.size() - in.at) + " extra bytes");
}

// ---- Decompressor -------------------------------------------------------------

Decompressor::Decompressor() : dctx_(ZSTD_createDCtx()) {
  if (!dctx_) fail(Exit::failure, "zstd: cannot create a decompression context");
}

Decompressor::~Decompressor() { ZSTD_freeDCtx(dctx_); }

std::span<std::uint8_t> Decompressor::buffer() {
  if (!buf_) buf_.reset(new std::uint8_t[kChunk]);
  return {buf_.get(), kChunk};
}

void decode_xor(Decompressor& d, std::span<const std::uint8_t> frame, std::uint64_t nbytes, const std::string& what,
                const XorPatch& patch) {
  check_declared_size(frame, nbytes, what);
  FrameReader r(d, frame, what);
  std::uint64_t off = 0;
  for (auto piece = r.next(); !piece.empty(); piece = r.next()) {
    if (piece.size() > nbytes - off) r.bad("decodes to more than the tensor's " + std::to_string(nbytes) + " bytes");
    patch(off, piece);
    off += piece.size();
  }
  if (off != nbytes) r.bad("decodes to " + std::to_string(off) + " bytes, the tensor has " + std::to_string(nbytes));
}

void decode_overwrite(Decompressor& dp, Decompressor& dv, std::span<const std::uint8_t> frame, std::uint64_t nbytes,
                      const std::string& what, const OverwritePatch& patch) {
  FrameReader pos(dp, frame, what);
  std::uint8_t kb[4];
  pos.read(kb, 4);
  const std::uint64_t k = get_le32(kb);
  if (k > nbytes)
    pos.bad("declares " + std::to_string(k) + " changed bytes in a " + std::to_string(nbytes) + "-byte tensor");
  check_declared_size(frame, 4 + 5 * k, what);
  // A second reader over the same frame walks the values while the first
  // walks the positions, so memory stays bounded whatever K is.
  FrameReader val(dv, frame, what);
  val.skip(4 + 4 * k);

  constexpr std::size_t kBatch = 16 * 1024;
  std::vector<std::uint8_t> raw(4 * kBatch);
  std::vector<std::uint64_t> positions(kBatch);
  std::vector<std::uint8_t> values(kBatch);
  std::uint64_t prev = 0;
  bool first = true;
  for (std::uint64_t done = 0; done < k;) {
    const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(kBatch, k - done));
    pos.read(raw.data(), 4 * m);
    val.read(values.data(), m);
    for (std::size_t i = 0; i < m; ++i) {
      const std::uint64_t p = get_le32(raw.data() + 4 * i);
      if (p >= nbytes)
        pos.bad("has position " + std::to_string(p) + " outside the " + std::to_string(nbytes) + "-byte tensor");
      if (!first && p <= prev) pos.bad("has positions out of ascending order at " + std::to_string(p));
      positions[i] = prev = p;
      first = false;
    }
    patch({positions.data(), m}, {values.data(), m});
    done += m;
  }
  val.expect_end();
}

std::vector<std::uint8_t> stack_head(const std::vector<StackLayer>& layers) {
  std::vector<std::uint8_t> h(kStackHeadSize + layers.size() * kStackLayerSize, 0);
  std::memcpy(h.data(), encoding_info(Encoding::stack).magic.data(), 4);
  put_le32(h.data() + 4, static_cast<std::uint32_t>(layers.size()));
  for (std::size_t i = 0; i < layers.size(); ++i) {
    std::uint8_t* r = h.data() + kStackHeadSize + i * kStackLayerSize;
    const StackLayer& p = layers[i];
    if (p.enc == Encoding::stack) fail(Exit::failure, "stack_head: a stacked entry cannot hold another");
    put_le32(r, code_of(p.enc, "stack_head"));
    put_le64(r + 8, p.size);
    put_le64(r + 16, p.hash.high);
    put_le64(r + 24, p.hash.low);
  }
  return h;
}

std::vector<StackLayer> read_stack(std::span<const std::uint8_t> entry, const Hash128& new_hash,
                                   const std::string& what) {
  if (entry.size() < kStackHeadSize || std::memcmp(entry.data(), encoding_info(Encoding::stack).magic.data(), 4) != 0)
    fail(Exit::bad_input, what + ": stacked entry does not start with HFK1");
  const std::uint64_t n = get_le32(entry.data() + 4);
  // Bounded by the entry's own bytes, so a hostile count cannot make this allocate.
  if (n == 0 || n > (entry.size() - kStackHeadSize) / kStackLayerSize)
    fail(Exit::bad_input, what + ": stacked entry declares " + std::to_string(n) + " layers, which its " +
                              std::to_string(entry.size()) + " bytes cannot hold");
  std::vector<StackLayer> layers(static_cast<std::size_t>(n));
  std::uint64_t at = kStackHeadSize + n * kStackLayerSize;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const std::uint8_t* r = entry.data() + kStackHeadSize + i * kStackLayerSize;
    StackLayer& p = layers[i];
    const std::uint32_t code = get_le32(r);
    const std::optional<Encoding> enc = encoding_of_code(code);
    if (!enc || get_le32(r + 4) != 0)
      fail(Exit::bad_input, what + ": layer " + std::to_string(i) + " of the stacked entry has unknown encoding " +
                                std::to_string(code));
    p.enc = *enc;  // a parts layer's head is read by the delta reader (read_parts)
    p.size = get_le64(r + 8);
    p.hash = {get_le64(r + 16), get_le64(r + 24)};
    if (p.size > entry.size() - at)
      fail(Exit::bad_input, what + ": layer " + std::to_string(i) + " of the stacked entry runs past its end");
    p.bytes = entry.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(p.size));
    at += p.size;
  }
  if (at != entry.size())
    fail(Exit::bad_input,
         what + ": stacked entry has " + std::to_string(entry.size() - at) + " bytes after its last layer");
  if (layers.back().hash != new_hash)
    fail(Exit::bad_input, what + ": stacked entry ends at checksum " + layers.back().hash.hex() +
                              ", but the delta records " + new_hash.hex());
  return layers;
}

}  // namespace hfdelta
