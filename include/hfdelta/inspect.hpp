// delta-diff --inspect: what a delta version directory changes, read from the
// delta alone (no base checkpoint), with the same validation as delta-apply's
// checks of the delta itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>
#include <nlohmann/json_fwd.hpp>

#include "hfdelta/delta_format.hpp"
#include "hfdelta/encodings.hpp"
#include "hfdelta/hash.hpp"

namespace hfdelta {

// One changed tensor's entry. Counts that the entry cannot tell without the
// base (the dtype travels nowhere in a delta) are left empty rather than guessed.
struct InspectEntry {
  std::string tensor;
  std::string file;  // delta file holding the entry
  Encoding encoding = Encoding::xor_bytes;
  std::uint64_t entry_bytes = 0;                  // L of the U8 [L] entry
  std::optional<std::uint64_t> tensor_bytes;      // target length: sparse head, xor frame; not overwrite
  std::optional<std::uint64_t> element_size;      // sparse, context: the element size its positions use
  std::optional<std::uint64_t> changed_elements;  // sparse, context: sum of the chunks' K
  // context (also as a stacked layer): its positions count base elements of
  // each context group, so whether they fit is known only against the base
  // (delta-apply checks it, before the checksums).
  bool needs_base = false;
  std::optional<std::uint64_t> changed_bytes;  // xor: non-zero bytes of the mask; overwrite: K
  // The entries it holds (--json: stack_parts). stack: its layers (each
  // checked like an entry of its kind, a parts layer region by region); the
  // net change of layers laid one after another is not known without the
  // base. parts: its regions' parts.
  std::uint64_t pieces = 0;
  // XXH3-128 of the tensor's new bytes (of the head, for a parts entry or a
  // stacked entry whose last layer is one: see docs/format.md, "parts").
  Hash128 checksum;
  std::optional<std::uint32_t> adler32;  // recorded instead, in an adler32 delta
  std::optional<Hash128> base_checksum;  // hfdelta deltas only
  // The checksum as the delta writes it.
  std::string checksum_hex() const { return adler32 ? adler32_hex(*adler32) : checksum.hex(); }
};

// One non-weight file operation (hfdelta_files).
struct InspectFile {
  std::string path;
  FileChange::Op op = FileChange::Op::put;
  std::uint64_t size = 0;  // put only
  Hash128 checksum;        // put only
};

// One weight-file operation of a structural delta (hfdelta_shards).
struct InspectShard {
  std::string file;
  ShardOp::Op op = ShardOp::Op::build;
  std::uint64_t header_bytes = 0;  // header, build: the new header's size
  std::uint64_t size = 0;          // build: the file's size
  // build: its tensors; copied from a base tensor of the same name, from one
  // of another name (renamed or moved), or starting from zeros (new).
  std::uint64_t tensors = 0, copied = 0, renamed = 0, fresh = 0;
};

struct DeltaInspection {
  boost::filesystem::path dir;
  std::uint64_t version = 0, base_version = 0;
  std::optional<std::uint64_t> format;  // hfdelta_format; none for slime-layout deltas
  std::string encoding;                 // metadata.delta_encoding: xor, overwrite, sparse or auto
  std::string checksum_format;          // what the entries record: xxh3-128, or adler32 (slime layout)
  std::optional<Hash128> index_checksum;
  std::vector<InspectEntry> entries;  // sorted by tensor name
  std::vector<InspectFile> files;     // in index order
  std::vector<InspectShard> shards;   // by file name
  // Totals. Element and byte counts add up only the entries that know them.
  std::uint64_t entry_bytes = 0, tensor_bytes = 0, changed_elements = 0, changed_bytes = 0;
  EncodingCounts entries_by_encoding;
  std::uint64_t files_put = 0, files_removed = 0, file_bytes = 0;
  std::uint64_t shards_built = 0, shards_rewritten = 0, shards_removed = 0;
  std::uint64_t delta_bytes = 0;  // every regular file under the delta directory
};

// Reads and checks DIR: the index (read_delta_index), every delta file's
// safetensors header, entry dtype/shape/mapping/checksum, the structure of
// every entry (sparse: head and chunk table, every frame complete; overwrite:
// the frame complete and its count; xor: decoded in full, in bounded pieces),
// and carried files against their recorded size and checksum. Throws
// Error(bad_input) naming the file and the problem, Error(unsupported) for a
// delta this build cannot read.
DeltaInspection inspect_delta(const boost::filesystem::path& dir);

// The documented JSON form (man delta-diff, INSPECT OUTPUT).
nlohmann::json inspection_json(const DeltaInspection& d);

}  // namespace hfdelta
