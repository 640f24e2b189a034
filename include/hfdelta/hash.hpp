// XXH3-128 checksums in the canonical text form of the delta format:
// 32 lowercase hex digits, high 64 bits first.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace hfdelta {

class File;

struct Hash128 {
  std::uint64_t high = 0;
  std::uint64_t low = 0;
  std::string hex() const;
  bool operator==(const Hash128&) const = default;
};

// Parses a 32-hex-digit checksum (either case); throws Error(bad_input) naming `what`.
Hash128 parse_hash_hex(const std::string& s, const std::string& what);

Hash128 xxh3_128(std::span<const std::uint8_t> bytes);

// Streaming form, for data read in chunks.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(Hasher&&) noexcept;
  Hasher& operator=(Hasher&&) noexcept;
  void reset();
  void update(std::span<const std::uint8_t> bytes);
  Hash128 digest() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Adler-32 (zlib's, RFC 1950), the checksum some publishers of the slime
// layout record instead (checksum_format "adler32"): running, from 1.
class Adler32 {
 public:
  void update(std::span<const std::uint8_t> bytes);
  std::uint32_t value() const { return value_; }

 private:
  std::uint32_t value_ = 1;
};

// An Adler-32 as those publishers write it: 8 hex digits, high first.
std::string adler32_hex(std::uint32_t v);
// Parses one (either case); throws Error(bad_input) naming `what`.
std::uint32_t parse_adler32_hex(const std::string& s, const std::string& what);

// XXH3-128 of `n` bytes of `f` at `offset`, read a window at a time into
// `buf` (the caller's, reused across calls).
Hash128 hash_file_range(const File& f, std::uint64_t offset, std::uint64_t n, std::vector<std::uint8_t>& buf);

}  // namespace hfdelta
