// The "parts" entry (format revision 6, docs/format.md "parts"): the entry of
// a tensor diffed piece by piece by several processes (a sharded trainer),
// made of complete entries of regions of the tensor seen as a matrix, each
// with the checksum of its region's new bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hfdelta/codec.hpp"
#include "hfdelta/hash.hpp"

namespace hfdelta {

inline constexpr std::size_t kPartsHeadSize = 32;
inline constexpr std::size_t kPartsRecordSize = 64;
inline constexpr std::uint32_t kPartsMax = 65536;

// A tensor seen as a matrix: rows = its first dimension (1 for a scalar),
// cols = the product of the others, es = its element size.
struct MatrixShape {
  std::uint64_t rows = 1, cols = 1, es = 1;
  std::uint64_t bytes() const { return rows * cols * es; }
  bool operator==(const MatrixShape&) const = default;
};
MatrixShape matrix_shape(std::span<const std::uint64_t> shape, std::size_t dtype_size);

// A rectangle of a matrix: rows [row0, row0 + rows) times columns [col0, col0 + cols).
struct Region {
  std::uint64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
  std::uint64_t elements() const { return rows * cols; }
  bool overlaps(const Region& o) const {
    return row0 < o.row0 + o.rows && o.row0 < row0 + rows && col0 < o.col0 + o.cols && o.col0 < col0 + cols;
  }
  // The whole region is one contiguous byte range of the tensor.
  bool contiguous(const MatrixShape& m) const { return rows == 1 || (col0 == 0 && cols == m.cols); }
  bool operator==(const Region&) const = default;
};

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
