// A region of a tensor seen as a matrix: what a rank of a sharded trainer
// holds of a tensor (ShardedPublisher::put), and what a "parts" entry
// records of each of its parts (docs/format.md, "parts").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace hfdelta {

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

}  // namespace hfdelta
