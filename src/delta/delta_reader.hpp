// The one reader of delta version directories: delta-apply, delta-diff
// --inspect and --squash open a delta through open_delta, so that they accept
// and refuse the same deltas and read each index once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "codec/codec.hpp"
#include "delta/delta_format_internal.hpp"
#include "delta/parts.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/safetensors.hpp"
#include "util/io.hpp"

namespace hfdelta {

// One entry of a delta: the new bytes of one tensor, coded against its base.
// Refers into its OpenDelta (names, mapping), so it lives as long as that.
struct DeltaEntry {
  const std::string* file = nullptr;  // the delta file holding it (a key of OpenDelta::headers)
  const TensorInfo* info = nullptr;   // its entry in that file's header (name: the tensor's in the target)
  Encoding encoding = Encoding::xor_bytes;
  std::span<const std::uint8_t> frame;      // the entry's bytes, in the file's mapping
  Hash128 new_hash;                         // of the tensor's new bytes (the file's __metadata__)
  std::optional<std::uint32_t> adler32;     // instead, in an adler32 delta (new_hash then unknown)
  std::optional<Hash128> base_hash;         // of its base bytes (hfdelta_base_checksums)
  std::vector<StackLayer> layers;           // a stacked entry's layers, in order (views into `frame`)
  std::shared_ptr<const PartsEntry> parts;  // a parts entry's head (views into `frame`)
  // A stacked entry's parts layers' heads, by layer (null for the others).
  std::vector<std::shared_ptr<const PartsEntry>> layer_parts;

  const std::string& tensor() const { return info->name; }
};

// What an entry records of its tensor's new bytes: the whole tensor's
// checksum (none known in an adler32 delta: its Adler-32 is checked as the
// entry is laid, its XXH3-128 computed then), or, where it ends with a parts entry (a sharded publisher's, or
// a stacked entry whose last layer is one), only the checksums of regions of
// the tensor seen as matrix `m`: the rest of its new bytes is not in the delta.
struct NewBytes {
  std::optional<Hash128> whole;
  MatrixShape m;
  std::vector<std::pair<Region, Hash128>> regions;  // each region's bytes, row-major
};
NewBytes new_bytes_of(const DeltaEntry& e);

// A delta directory, validated once, its files mapped. Views (entries,
// new headers) stay valid as long as this object; it moves, never copies.
struct OpenDelta {
  OpenDelta() = default;
  OpenDelta(OpenDelta&&) = default;
  OpenDelta& operator=(OpenDelta&&) = default;
  OpenDelta(const OpenDelta&) = delete;
  OpenDelta& operator=(const OpenDelta&) = delete;

  boost::filesystem::path dir;
  DeltaIndex index;
  std::map<std::string, SafetensorsHeader> headers;  // delta file -> its header
  std::map<std::string, MappedFile> maps;            // delta file -> its bytes
  std::map<std::string, MappedFile> new_headers;     // hfdelta_shards file -> bytes of headers/<file>
  std::vector<DeltaEntry> entries;                   // by delta file, then in file order

  std::string index_path() const;
  std::string path_of(const DeltaEntry& e) const;              // its delta file's path, for messages
  std::string_view new_header(const std::string& file) const;  // bytes of headers/<file>
};

// Opens and checks a delta directory on its own, as delta-apply, --inspect
// and --squash all need it before anything else (whether it fits LOCAL is
// delta-apply's alone):
// - nothing inside DIR is a symlink (the index, a delta file, files/,
//   headers/, or anything below them): a delta is read from its own files only;
// - the index (read_delta_index);
// - every delta file weight_map names: a regular file, a valid safetensors
//   file, each entry checked by check_delta_entry, each tensor the index maps
//   to it present, a built tensor's entry of the checksum hfdelta_shards
//   records, a stacked entry's layers well formed (read_stack), a parts entry's
//   head and a stacked parts layer's (read_parts; either needs a base
//   checksum, and a stacked one format revision 6);
// - hfdelta_files: nothing under .weight_sync, no file the delta itself
//   treats as a weight file (hfdelta_targets, hfdelta_shards) unless it
//   stops or starts being one there, and each `put` carried under files/ with
//   the recorded size and checksum;
// - hfdelta_shards: each new header carried under headers/ with its recorded
//   size and checksum, a built file's header holding the tensors listed.
// Entries are not decoded here (delta-apply decodes them as it applies,
// --inspect in a pass of its own). Throws Error(bad_input) naming the file
// and the problem, Error(unsupported) as read_delta_index does.
OpenDelta open_delta(const boost::filesystem::path& dir);
// Same, with DIR's index already read (read_index_if_delta, delta_format.hpp).
OpenDelta open_delta(const boost::filesystem::path& dir, DeltaIndex index);

}  // namespace hfdelta
