// An independent reading of one zstd frame with zstd's one-shot API, to hold
// the streaming decoders of the library against.
#pragma once

#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_getFrameHeader
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace fuzz {

// Whether `frame` starts with the magic number of a pre-1.0 ("legacy") zstd
// format, 0xFD2FB522 to 0xFD2FB527. Debian's libzstd decodes these, with
// decoders of their own that do not agree with the one-shot API on truncated
// frames (the streaming one takes `27 b5 2f fd 24 00 00 00 00` for a complete
// empty frame, the one-shot one refuses it), so the targets hold no opinion
// on them and compare only frames of the current format.
inline bool is_legacy_frame(std::span<const std::uint8_t> frame) {
  if (frame.size() < 4) return false;
  std::uint32_t magic = 0;
  for (std::size_t i = 0; i < 4; ++i) magic |= std::uint32_t(frame[i]) << (8 * i);
  return magic >= 0xFD2FB522u && magic <= 0xFD2FB527u;
}

// The decoded content if `frame` is exactly one complete, valid zstd frame of
// the current format (magic 0xFD2FB528 only: the library refuses skippable
// frames too) of at most `cap` bytes that a streaming decoder with zstd's
// default memory limit would decode; nullopt otherwise.
inline std::optional<std::vector<std::uint8_t>> zstd_one_frame(std::span<const std::uint8_t> frame, std::size_t cap) {
  if (frame.size() < 4 || (std::uint32_t(frame[0]) | std::uint32_t(frame[1]) << 8 | std::uint32_t(frame[2]) << 16 |
                           std::uint32_t(frame[3]) << 24) != 0xFD2FB528u)
    return std::nullopt;
  if (ZSTD_findFrameCompressedSize(frame.data(), frame.size()) != frame.size()) return std::nullopt;
  ZSTD_frameHeader zfh;
  if (ZSTD_getFrameHeader(&zfh, frame.data(), frame.size()) != 0) return std::nullopt;
  // Streaming decoders refuse windows over 2^ZSTD_WINDOWLOG_LIMIT_DEFAULT
  // unless told otherwise; the one-shot decoder does not look at the window.
  if (zfh.frameType == ZSTD_frame && zfh.windowSize > (1ull << ZSTD_WINDOWLOG_LIMIT_DEFAULT)) return std::nullopt;
  // Room for one byte more than allowed, so longer content shows up as too
  // long; no more than the frame can decode to, which keeps small inputs fast.
  const unsigned long long bound = ZSTD_decompressBound(frame.data(), frame.size());
  if (bound == ZSTD_CONTENTSIZE_ERROR) return std::nullopt;
  const std::size_t room = static_cast<std::size_t>(std::min<unsigned long long>(bound, cap)) + 1;
  std::unique_ptr<std::uint8_t[]> buf(new std::uint8_t[room]);
  std::size_t r = ZSTD_decompress(buf.get(), room, frame.data(), frame.size());
  if (ZSTD_isError(r)) {
    // The one-shot decoder refuses a few odd frames the streaming one takes
    // (an RLE block of length 0, say), which the zstd command line decodes
    // too: let zstd's own streaming API, in one call, have the last word.
    std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> d(ZSTD_createDCtx(), ZSTD_freeDCtx);
    ZSTD_inBuffer in{frame.data(), frame.size(), 0};
    ZSTD_outBuffer out{buf.get(), room, 0};
    const std::size_t s = ZSTD_decompressStream(d.get(), &out, &in);
    if (ZSTD_isError(s) || s != 0 || in.pos != in.size) return std::nullopt;
    const unsigned long long declared = ZSTD_getFrameContentSize(frame.data(), frame.size());
    if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != out.pos) return std::nullopt;
    r = out.pos;
  }
  if (r > cap) return std::nullopt;
  return std::vector<std::uint8_t>(buf.get(), buf.get() + r);
}

}  // namespace fuzz
