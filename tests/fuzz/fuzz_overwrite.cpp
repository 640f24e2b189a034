// Fuzz target: the "overwrite" delta decoder on an untrusted frame.
//
// Input: 4 bytes, little-endian, giving the tensor size (folded to at most
// 1 MiB), then the frame. Every position handed out must lie inside the tensor
// and ascend strictly across batches; on success the batches must be exactly
// what zstd's own one-shot decoder reads out of the frame, and a frame that
// decodes to a well-formed patch must be accepted.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/codec.hpp"
#include "fuzz_check.hpp"
#include "hfdelta/error.hpp"
#include "zstd_ref.hpp"

namespace {

std::uint32_t le32(const std::uint8_t* p) {
  return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24;
}

// Whether decoded frame content is a well-formed patch for an nbytes tensor.
bool well_formed(const std::vector<std::uint8_t>& c, std::uint64_t nbytes) {
  if (c.size() < 4) return false;
  const std::uint64_t k = le32(c.data());
  if (k > nbytes || c.size() != 4 + 5 * k) return false;
  for (std::uint64_t i = 0; i < k; ++i) {
    const std::uint64_t p = le32(c.data() + 4 + 4 * i);
    if (p >= nbytes) return false;
    if (i > 0 && p <= le32(c.data() + 4 * i)) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static hfdelta::Decompressor dp, dv;
  const std::uint64_t nbytes = fuzz::tensor_size(data, size);
  const std::span<const std::uint8_t> frame =
      size >= 4 ? std::span(data + 4, size - 4) : std::span<const std::uint8_t>();

  std::vector<std::uint64_t> positions;
  std::vector<std::uint8_t> values;
  bool ok = true;
  try {
    hfdelta::decode_overwrite(dp, dv, frame, nbytes, "fuzz",
                              [&](std::span<const std::uint64_t> pos, std::span<const std::uint8_t> val) {
                                FUZZ_CHECK(!pos.empty());
                                FUZZ_CHECK(pos.size() == val.size());
                                for (const std::uint64_t p : pos) {
                                  FUZZ_CHECK(p < nbytes);
                                  FUZZ_CHECK(positions.empty() || p > positions.back());
                                  positions.push_back(p);
                                }
                                values.insert(values.end(), val.begin(), val.end());
                              });
  } catch (const hfdelta::Error& e) {
    FUZZ_CHECK(e.code() == hfdelta::Exit::bad_input);
    ok = false;
  }

  if (ok) FUZZ_CHECK(positions.size() <= nbytes);
  if (fuzz::is_legacy_frame(frame)) return 0;
  const auto ref = fuzz::zstd_one_frame(frame, 4 + 5 * nbytes);
  const bool ref_ok = ref && well_formed(*ref, nbytes);
  if (ok) {
    FUZZ_CHECK(ref_ok);
    const std::uint64_t k = le32(ref->data());
    FUZZ_CHECK(positions.size() == k);
    for (std::uint64_t i = 0; i < k; ++i) {
      FUZZ_CHECK(positions[i] == le32(ref->data() + 4 + 4 * i));
      FUZZ_CHECK(values[i] == (*ref)[4 + 4 * k + i]);
    }
  } else {
    FUZZ_CHECK(!ref_ok);
  }
  return 0;
}
