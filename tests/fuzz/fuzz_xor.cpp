// Fuzz target: the "xor" delta decoder on an untrusted frame.
//
// Input: 4 bytes, little-endian, giving the tensor size (folded to at most
// 1 MiB), then the frame. On success the patch must have covered the tensor
// exactly once, in order, and agree with zstd's own one-shot decoder; a frame
// that zstd decodes to exactly the tensor's length must be accepted.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "codec/codec.hpp"
#include "fuzz_check.hpp"
#include "hfdelta/error.hpp"
#include "zstd_ref.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static hfdelta::Decompressor d;  // reused across inputs, as the apply path does
  const std::uint64_t nbytes = fuzz::tensor_size(data, size);
  const std::span<const std::uint8_t> frame =
      size >= 4 ? std::span(data + 4, size - 4) : std::span<const std::uint8_t>();

  std::vector<std::uint8_t> got;
  bool ok = true;
  try {
    hfdelta::decode_xor(d, frame, nbytes, "fuzz", [&](std::uint64_t off, std::span<const std::uint8_t> piece) {
      FUZZ_CHECK(!piece.empty());
      FUZZ_CHECK(off == got.size());
      FUZZ_CHECK(off <= nbytes && piece.size() <= nbytes - off);
      got.insert(got.end(), piece.begin(), piece.end());
    });
  } catch (const hfdelta::Error& e) {
    FUZZ_CHECK(e.code() == hfdelta::Exit::bad_input);
    ok = false;
  }

  if (ok) FUZZ_CHECK(got.size() == nbytes);
  if (fuzz::is_legacy_frame(frame)) return 0;
  const auto ref = fuzz::zstd_one_frame(frame, nbytes);
  const bool ref_ok = ref && ref->size() == nbytes;
  if (ok) {
    FUZZ_CHECK(ref_ok);
    FUZZ_CHECK(nbytes == 0 || std::memcmp(ref->data(), got.data(), nbytes) == 0);
  } else {
    FUZZ_CHECK(!ref_ok);
  }
  return 0;
}
