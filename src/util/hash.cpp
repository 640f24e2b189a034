#include "hfdelta/hash.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "hfdelta/error.hpp"
#include "util/io.hpp"

#include <zlib.h>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t inside Hasher::State
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
// libxxhash picks the widest vector unit of the CPU at run time (SSE2, AVX2,
// AVX-512): four times the speed of a build for the baseline instruction set.
#include <xxh_x86dispatch.h>
#define HFDELTA_XXH3_128 XXH3_128bits_dispatch
#define HFDELTA_XXH3_128_UPDATE XXH3_128bits_update_dispatch
#else
#define HFDELTA_XXH3_128 XXH3_128bits
#define HFDELTA_XXH3_128_UPDATE XXH3_128bits_update
#endif

namespace hfdelta {

std::string Hash128::hex() const {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = digits[(high >> (4 * i)) & 0xf];
    s[31 - i] = digits[(low >> (4 * i)) & 0xf];
  }
  return s;
}

Hash128 parse_hash_hex(const std::string& s, const std::string& what) {
  if (s.size() != 32) fail(Exit::bad_input, what + ": checksum \"" + s + "\" is not 32 hex digits");
  Hash128 h;
  for (std::size_t i = 0; i < 32; ++i) {
    const char c = s[i];
    unsigned d;
    if (c >= '0' && c <= '9')
      d = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f')
      d = static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      d = static_cast<unsigned>(c - 'A' + 10);
    else
      fail(Exit::bad_input, what + ": checksum \"" + s + "\" is not 32 hex digits");
    std::uint64_t& word = i < 16 ? h.high : h.low;
    word = (word << 4) | d;
  }
  return h;
}

void Adler32::update(std::span<const std::uint8_t> bytes) {
  value_ = static_cast<std::uint32_t>(adler32_z(value_, bytes.data(), bytes.size()));
}

std::string adler32_hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(v));
  return buf;
}

std::uint32_t parse_adler32_hex(const std::string& s, const std::string& what) {
  std::uint32_t v = 0;
  const bool ok = s.size() == 8 &&
                  std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
  if (!ok) fail(Exit::bad_input, what + ": checksum \"" + s + "\" is not 8 hex digits (an adler32)");
  for (const char c : s)
    v = (v << 4) | static_cast<std::uint32_t>(std::isdigit(static_cast<unsigned char>(c))
                                                  ? c - '0'
                                                  : (std::tolower(static_cast<unsigned char>(c)) - 'a' + 10));
  return v;
}

Hash128 xxh3_128(std::span<const std::uint8_t> bytes) {
  const XXH128_hash_t h = HFDELTA_XXH3_128(bytes.data(), bytes.size());
  return {h.high64, h.low64};
}

struct Hasher::State {
  XXH3_state_t st;
};

Hasher::Hasher() : s_(std::make_unique<State>()) { reset(); }
Hasher::~Hasher() = default;
Hasher::Hasher(Hasher&&) noexcept = default;
Hasher& Hasher::operator=(Hasher&&) noexcept = default;

void Hasher::reset() { XXH3_128bits_reset(&s_->st); }
void Hasher::update(std::span<const std::uint8_t> bytes) {
  HFDELTA_XXH3_128_UPDATE(&s_->st, bytes.data(), bytes.size());
}
Hash128 Hasher::digest() const {
  const XXH128_hash_t h = XXH3_128bits_digest(&s_->st);
  return {h.high64, h.low64};
}

Hash128 hash_file_range(const File& f, std::uint64_t offset, std::uint64_t n, std::vector<std::uint8_t>& buf) {
  constexpr std::uint64_t kWindow = 1 << 20;  // large reads; the checksum does not depend on it
  Hasher h;
  buf.resize(kWindow);
  for (std::uint64_t at = 0; at < n; at += kWindow) {
    const std::size_t k = static_cast<std::size_t>(std::min(kWindow, n - at));
    f.pread_exact(buf.data(), k, offset + at);
    h.update({buf.data(), k});
  }
  return h.digest();
}

}  // namespace hfdelta
