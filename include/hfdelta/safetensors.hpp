// Strict safetensors header reader and writer (format: docs/format.md, "Checkpoint directories").
//
// Validation follows the reference reader rule for rule; a parsed header is a
// plain description of where each tensor's bytes are, and callers take views of
// the data through MappedFile or pread, never copies.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <boost/filesystem/path.hpp>

namespace hfdelta {

// Largest header the reference reader accepts.
inline constexpr std::uint64_t kMaxHeaderSize = 100'000'000;

// Element size in bytes of a safetensors dtype, or 0 for a dtype this tool
// does not know (such tensors are carried as opaque bytes).
std::size_t dtype_size(std::string_view dtype);

// "[4096, 1024]", for messages.
std::string shape_string(const std::vector<std::uint64_t>& shape);

struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  // offsets into the data buffer (after the header)
  std::uint64_t end = 0;
  std::uint64_t nbytes() const { return end - begin; }
  std::uint64_t elements() const;  // product(shape); 1 for a scalar
  // Elements as delta-diff counts them (its summary, the index's
  // hfdelta_elements): elements(), or bytes for a dtype of no known size.
  std::uint64_t counted_elements() const;
};

struct SafetensorsHeader {
  std::uint64_t header_len = 0;  // N: JSON bytes after the 8-byte length
  std::uint64_t file_size = 0;
  std::string header;  // the N raw bytes, for byte-exact comparison
  bool has_metadata = false;
  std::map<std::string, std::string> metadata;
  std::vector<TensorInfo> tensors;  // sorted by data offset

  std::uint64_t data_start() const { return 8 + header_len; }
  // Absolute file offset of a tensor's first byte.
  std::uint64_t file_offset(const TensorInfo& t) const { return data_start() + t.begin; }
  const TensorInfo* find(std::string_view name) const;  // linear; callers index if hot
  // The file's first 8 + N bytes, as written: the length, then the header.
  std::string prefix() const;
};

// Whether two headers put the same tensor byte ranges in files of the same
// size behind headers of the same length (names, dtypes, shapes or
// __metadata__ may differ): a header that can replace the other in place.
bool same_tensor_ranges(const SafetensorsHeader& a, const SafetensorsHeader& b);

// Parses and validates a header. `bytes` holds at least the file's first
// 8 + N bytes (the whole file is fine); `file_size` is the file's real size;
// `what` names the file in error messages. Throws Error(Exit::bad_input).
SafetensorsHeader parse_safetensors(std::string_view bytes, std::uint64_t file_size, const std::string& what);

// Reads just the header of a file (two preads) and validates it.
SafetensorsHeader read_safetensors(const boost::filesystem::path& path);

// ---- writing --------------------------------------------------------------

struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t nbytes = 0;  // must equal product(shape) * dtype_size for known dtypes
};

struct SafetensorsLayout {
  std::string prefix;               // 8-byte length + JSON header, padded with spaces
  std::vector<TensorInfo> tensors;  // in data order
  std::uint64_t file_size = 0;
};

// Lays out a file the way the reference writer does: data ordered by dtype
// (the reference's enumeration, last first: U64, I64, F64, ..., BOOL) then name, header padded with spaces to a multiple of 8.
// `min_header_len` reserves header room (padding with spaces), which lets a
// streaming writer put the data first and the header last.
SafetensorsLayout layout_safetensors(std::vector<TensorSpec> specs, const std::map<std::string, std::string>* metadata,
                                     std::uint64_t min_header_len = 0);

// Builds the 8-byte-length-prefixed header for tensors whose offsets are
// already decided, padded with spaces to exactly `header_len` bytes when given
// (0: the smallest multiple of 8). Throws if it does not fit.
std::string encode_safetensors_header(const std::vector<TensorInfo>& tensors,
                                      const std::map<std::string, std::string>* metadata, std::uint64_t header_len = 0);

}  // namespace hfdelta
