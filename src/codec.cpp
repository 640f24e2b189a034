#include "hfdelta/codec.hpp"

#include <algorithm>
#include <cstring>

#include <zstd.h>

#include "hfdelta/error.hpp"

namespace hfdelta {

namespace {

// Work in pieces this size: big enough to amortise calls, small enough to stay
// in cache and keep memory flat whatever the tensor size.
constexpr std::size_t kChunk = 256 * 1024;

[[noreturn]] void zstd_fail(const char* op, std::size_t code) {
  fail(Exit::failure, std::string("zstd ") + op + ": " + ZSTD_getErrorName(code));
}

void put_le32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

std::uint32_t get_le32(const std::uint8_t* p) {
  return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24;
}

void check_declared_size(std::span<const std::uint8_t> frame, std::uint64_t expect, const std::string& what) {
  const unsigned long long cs = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (cs == ZSTD_CONTENTSIZE_ERROR) fail(Exit::bad_input, what + ": not a zstd frame");
  if (cs != ZSTD_CONTENTSIZE_UNKNOWN && cs != expect)
    fail(Exit::bad_input, what + ": zstd frame declares " + std::to_string(cs) + " bytes, expected " + std::to_string(expect));
}

}  // namespace

std::string_view encoding_name(Encoding e) {
  switch (e) {
    case Encoding::xor_bytes: return "xor";
    case Encoding::overwrite: return "overwrite";
  }
  return "?";
}

std::optional<Encoding> parse_encoding(std::string_view name) {
  if (name == "xor") return Encoding::xor_bytes;
  if (name == "overwrite") return Encoding::overwrite;
  return std::nullopt;
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

Compressor::~Compressor() { ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(cctx_)); }

void Compressor::begin(std::uint64_t pledged) {
  auto* c = static_cast<ZSTD_CCtx*>(cctx_);
  ZSTD_CCtx_reset(c, ZSTD_reset_session_only);
  if (auto r = ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level_); ZSTD_isError(r)) zstd_fail("level", r);
  // A frame checksum lets any zstd reader notice a damaged frame by itself.
  if (auto r = ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1); ZSTD_isError(r)) zstd_fail("checksum", r);
  if (auto r = ZSTD_CCtx_setPledgedSrcSize(c, pledged); ZSTD_isError(r)) zstd_fail("pledged size", r);
}

void Compressor::put(std::span<const std::uint8_t> in, const ByteSink& sink) {
  auto* c = static_cast<ZSTD_CCtx*>(cctx_);
  ZSTD_inBuffer ib{in.data(), in.size(), 0};
  while (ib.pos < ib.size) {
    ZSTD_outBuffer ob{out_.data(), out_.size(), 0};
    const std::size_t r = ZSTD_compressStream2(c, &ob, &ib, ZSTD_e_continue);
    if (ZSTD_isError(r)) zstd_fail("compress", r);
    if (ob.pos) sink({out_.data(), ob.pos});
  }
}

void Compressor::end(const ByteSink& sink) {
  auto* c = static_cast<ZSTD_CCtx*>(cctx_);
  ZSTD_inBuffer ib{nullptr, 0, 0};
  std::size_t r;
  do {
    ZSTD_outBuffer ob{out_.data(), out_.size(), 0};
    r = ZSTD_compressStream2(c, &ob, &ib, ZSTD_e_end);
    if (ZSTD_isError(r)) zstd_fail("compress", r);
    if (ob.pos) sink({out_.data(), ob.pos});
  } while (r != 0);
}

std::uint64_t encode_xor(Compressor& c, std::span<const std::uint8_t> a, std::span<const std::uint8_t> b,
                         const ByteSink& sink) {
  std::uint64_t frame = 0;
  const ByteSink counted = [&](std::span<const std::uint8_t> s) { frame += s.size(); sink(s); };
  std::vector<std::uint8_t> buf(kChunk);
  c.begin(b.size());
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
  const ByteSink counted = [&](std::span<const std::uint8_t> s) { frame += s.size(); sink(s); };
  std::vector<std::uint8_t> buf(kChunk);
  c.begin(4 + 5 * changed);
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
    : dctx_(d.ctx()), what_(what), buf_(kChunk) {
  in_data_ = frame.data();
  in_size_ = frame.size();
  ZSTD_DCtx_reset(static_cast<ZSTD_DCtx*>(dctx_), ZSTD_reset_session_only);
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
  auto* d = static_cast<ZSTD_DCtx*>(dctx_);
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

// ---- Decompressor -------------------------------------------------------------

Decompressor::Decompressor() : dctx_(ZSTD_createDCtx()) {
  if (!dctx_) fail(Exit::failure, "zstd: cannot create a decompression context");
}

Decompressor::~Decompressor() { ZSTD_freeDCtx(static_cast<ZSTD_DCtx*>(dctx_)); }

void decode_xor(Decompressor& d, std::span<const std::uint8_t> frame, std::uint64_t nbytes, const std::string& what,
                const XorPatch& patch) {
  check_declared_size(frame, nbytes, what);
  FrameReader r(d, frame, what);
  std::uint64_t off = 0;
  for (auto piece = r.next(); !piece.empty(); piece = r.next()) {
    if (piece.size() > nbytes - off)
      r.bad("decodes to more than the tensor's " + std::to_string(nbytes) + " bytes");
    patch(off, piece);
    off += piece.size();
  }
  if (off != nbytes)
    r.bad("decodes to " + std::to_string(off) + " bytes, the tensor has " + std::to_string(nbytes));
}

void decode_overwrite(Decompressor& dp, Decompressor& dv, std::span<const std::uint8_t> frame, std::uint64_t nbytes,
                      const std::string& what, const OverwritePatch& patch) {
  FrameReader pos(dp, frame, what);
  std::uint8_t kb[4];
  pos.read(kb, 4);
  const std::uint64_t k = get_le32(kb);
  if (k > nbytes) pos.bad("declares " + std::to_string(k) + " changed bytes in a " + std::to_string(nbytes) + "-byte tensor");
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
      if (p >= nbytes) pos.bad("has position " + std::to_string(p) + " outside the " + std::to_string(nbytes) + "-byte tensor");
      if (!first && p <= prev) pos.bad("has positions out of ascending order at " + std::to_string(p));
      positions[i] = prev = p;
      first = false;
    }
    patch({positions.data(), m}, {values.data(), m});
    done += m;
  }
  val.expect_end();
}

}  // namespace hfdelta
