// The "parts" entry (format revision 6, docs/format.md "parts"): the entry of
// a tensor diffed piece by piece by several processes (a sharded trainer),
// made of complete entries of regions of the tensor seen as a matrix, each
// with the checksum of its region's new bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "codec/codec.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/region.hpp"

namespace hfdelta {

inline constexpr std::size_t kPartsHeadSize = 32;
inline constexpr std::size_t kPartsRecordSize = 64;
inline constexpr std::uint32_t kPartsMax = 65536;

struct PartRecord {
  Region region;
  Encoding enc = Encoding::sparse;  // xor_bytes, sparse or context
  std::uint64_t size = 0;
  Hash128 hash;                         // of the region's new bytes, row-major
  std::span<const std::uint8_t> bytes;  // read_parts: the part within the entry
};

struct PartsEntry {
  MatrixShape m;
  std::vector<PartRecord> parts;
  std::size_t head_size() const { return kPartsHeadSize + kPartsRecordSize * parts.size(); }
};

// The head (magic, count, matrix, records) of a parts entry; its parts' bytes follow.
std::vector<std::uint8_t> parts_head(const MatrixShape& m, const std::vector<PartRecord>& parts);
// The checksum a parts entry records in __metadata__: of its head.
Hash128 parts_checksum(std::span<const std::uint8_t> entry_head);
// Splits a parts entry; throws Error(bad_input) naming `what` unless the head
// is well formed (regions inside the matrix, ordered, not overlapping; known
// encodings; parts filling the entry) and its checksum is `checksum`.
PartsEntry read_parts(std::span<const std::uint8_t> entry, const Hash128& checksum, const std::string& what);

}  // namespace hfdelta
