// What the delta's one writer and one reader (delta_writer, delta_reader)
// and --squash share of a delta directory beyond its index
// (hfdelta/delta_format.hpp): the index written and sealed, the delta files
// written and published, carried files mapped, entries checked
// (docs/format.md, "Delta version directory").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "format/root_commit.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/safetensors.hpp"
#include "util/io.hpp"

namespace hfdelta {

// Serialises an index (weight_map, total_size of the delta files, metadata).
std::string write_delta_index_json(const DeltaIndex& idx, std::uint64_t total_size);

// Recomputes hfdelta_index_checksum of an index that was edited on purpose
// (tests, tools); returns the index text.
std::string seal_delta_index(std::string_view text);

// Name of delta file `i` of `n`: model-IIIII-of-NNNNN.safetensors, from 0.
std::string delta_file_name(std::size_t i, std::size_t n);

// One entry of a delta file.
struct DeltaFileEntry {
  std::string name;  // the tensor
  std::uint64_t size = 0;
  Hash128 new_hash;  // of the tensor's new bytes, into __metadata__
};
// Writes a delta file at `path`: the safetensors header of the U8 entries
// with their checksums, then each entry's bytes, written by `body(i, file,
// offset)`. Flushed if `sync`.
void write_delta_file(const boost::filesystem::path& path, const std::vector<DeltaFileEntry>& entries,
                      const std::function<void(std::size_t, File&, std::uint64_t)>& body, bool sync);

// Finishes a delta written in the temporary directory `tmp`: writes its
// index and its completion marker (write_marker), flushes `dirs` (tmp and
// its subdirectories) if `sync`, and publishes it as `out` (publish_dir).
// `expect`: what publishing `out` into a root depends on, checked right
// before and after the rename (root_commit.hpp). Returns the size of every
// file of the delta.
std::uint64_t publish_delta(const boost::filesystem::path& tmp, const boost::filesystem::path& out,
                            const std::string& index, std::uint64_t version,
                            const std::set<boost::filesystem::path>& dirs, bool sync,
                            const PublishExpectation& expect = {});

// Maps a file a delta carries (files/..., headers/...) after checking it is a
// regular file of the size and checksum the index records; `listed` names
// the index key, for errors (Error(bad_input)).
MappedFile open_carried(const boost::filesystem::path& p, std::uint64_t size, const Hash128& hash,
                        const std::string& listed);

// Parses the new header a build operation carries (the bytes of
// headers/<file>, `where`) for a file of so.size bytes, and checks that it
// is exactly that, holding the tensors `so` lists in data order.
SafetensorsHeader parse_built_header(std::string_view bytes, const ShardOp& so, const std::string& where);

// The shard operation on `file`, if any.
const ShardOp* shard_op(const DeltaIndex& idx, const std::string& file);

// The checksum an entry records of its tensor's new bytes: an XXH3-128, or
// in an adler32 delta an Adler-32 (the XXH3-128 is then unknown, left zero).
struct EntryChecksum {
  Hash128 xxh3;
  std::optional<std::uint32_t> adler32;
};

// Checks entry `t` of delta file `file` (header `hdr`, path `where`) against
// the index: mapped to this file, U8 with shape [L], a checksum in
// __metadata__ of the index's checksum_format. Returns that checksum.
EntryChecksum check_delta_entry(const DeltaIndex& idx, const std::string& file, const SafetensorsHeader& hdr,
                                const TensorInfo& t, const std::string& where);

}  // namespace hfdelta
