// The delta version directory: a canonical HF checkpoint directory whose index
// metadata says which version it turns which base into (docs/format.md, "Index"),
// plus hfdelta's own documented extensions, which readers of the plain format
// ignore safely.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "hfdelta/encodings.hpp"
#include "hfdelta/hash.hpp"

namespace hfdelta {

inline constexpr const char* kIndexFile = "model.safetensors.index.json";
// Files other than weights travel under this subdirectory of a delta, so they
// can never collide with the delta's own index and shards.
inline constexpr const char* kFilesDir = "files";
// New safetensors headers of weight files a structural delta rewrites or
// builds travel under this subdirectory, byte for byte (8-byte length + JSON).
inline constexpr const char* kHeadersDir = "headers";
// Format revision of hfdelta's extensions; readers refuse a newer one.
// 1: base checksums and carried files; 2: the sparse encoding and per-tensor
// encodings ("auto"); 3: structural changes (hfdelta_shards); 4: stacked
// entries (encoding "stack"); 5: context entries (encoding "context", also
// as stacked layers). A delta records the lowest revision it needs.
// 6: parts entries (encoding "parts", docs/sharded.md, also as stacked layers).
inline constexpr int kFormatRevision = 6;

// A non-weight file of the target that differs from the base.
struct FileChange {
  enum class Op { put, remove };
  std::string path;  // relative to the checkpoint directory
  Op op = Op::put;
  std::uint64_t size = 0;  // put only
  Hash128 hash;            // put only: XXH3-128 of the whole file
};

// A weight file of the target that is not the base's file of the same name
// with the same header (those are patched in place and need no operation).
struct ShardOp {
  enum class Op {
    remove,  // a weight file of the base that the target does not have
    header,  // same tensor byte ranges and header length: only the header
             // bytes change (renames, dtype or shape with the same size,
             // __metadata__); patched in place, tensors too
    build,   // anything else: the file is built beside the old one from the
             // new header, base tensors (copied, possibly patched) and new
             // tensors (zeros patched by their entry), then swapped in
  };
  struct Tensor {
    std::string name;                 // in the target
    std::optional<std::string> from;  // base tensor of the same byte length; none: zeros
    Hash128 hash;                     // XXH3-128 of its new bytes
  };
  std::string file;
  Op op = Op::build;
  std::uint64_t header_size = 0;  // header, build: bytes of headers/<file>
  Hash128 header_hash;            // header, build: its XXH3-128
  Hash128 base_header_hash;       // header: XXH3-128 of the base's header bytes
  std::uint64_t size = 0;         // build: the file's size
  std::vector<Tensor> tensors;    // build: every tensor, in data order
  bool replaces = false;          // build: BASE has a weight file of this name
  // header: target name -> base name of the tensor at the same range, where
  // they differ (renames in place).
  std::map<std::string, std::string> renamed;
};

// What a delta's entries record of their tensors' new bytes
// (metadata.checksum_format). hfdelta writes xxh3-128; a publisher of the
// plain slime layout may write adler32 (miles' --update-weight-delta-checksum).
enum class ChecksumFormat { xxh3_128, adler32 };

struct DeltaIndex {
  std::uint64_t version = 0;
  std::uint64_t base_version = 0;
  Encoding encoding = Encoding::xor_bytes;
  bool per_tensor = false;                        // delta_encoding "auto": see `encodings`
  std::map<std::string, Encoding> encodings;      // tensor -> its encoding (per_tensor only)
  bool context_layers = false;                    // a stacked entry holds context layers (revision 5)
  bool parts_layers = false;                      // a stacked entry holds a parts entry (revision 6)
  std::map<std::string, std::string> weight_map;  // tensor -> delta file
  ChecksumFormat checksum_format = ChecksumFormat::xxh3_128;
  std::map<std::string, Hash128> base_checksums;  // tensor -> hash of its base bytes (hfdelta only)
  std::vector<FileChange> files;                  // hfdelta only
  std::vector<ShardOp> shards;                    // hfdelta only (revision 3), by file name
  // Delta file -> the weight file of the target its entries patch (entries
  // are grouped by target file); lets a chain of deltas be composed without
  // the checkpoints. Written since revision 3, for every delta.
  std::map<std::string, std::string> targets;
  // Elements of the target's tensors and how many of them changed
  // (metadata.hfdelta_elements, informational: the fleet view's density).
  // None where the writer cannot count them (--squash).
  struct Elements {
    std::uint64_t total = 0, changed = 0;
  };
  std::optional<Elements> elements;
  // As written in the index, for --inspect.
  std::string encoding_name;                     // metadata.delta_encoding
  std::optional<std::uint64_t> format_revision;  // metadata.hfdelta_format (none: a plain slime-layout delta)
  std::optional<Hash128> index_checksum;         // metadata.hfdelta_index_checksum
  bool structural() const { return !shards.empty(); }
};

// Metadata keys (index "metadata" object).
namespace key {
inline constexpr const char* version = "version";
inline constexpr const char* base_version = "base_version";
inline constexpr const char* delta_encoding = "delta_encoding";
inline constexpr const char* compression_format = "compression_format";
inline constexpr const char* checksum_format = "checksum_format";
inline constexpr const char* total_size = "total_size";
inline constexpr const char* format = "hfdelta_format";
inline constexpr const char* base_checksums = "hfdelta_base_checksums";
inline constexpr const char* files = "hfdelta_files";
inline constexpr const char* encodings = "hfdelta_encodings";
inline constexpr const char* shards = "hfdelta_shards";
inline constexpr const char* targets = "hfdelta_targets";
inline constexpr const char* elements = "hfdelta_elements";
// XXH3-128 of the index's compact JSON (nlohmann's dump, keys sorted) without this key.
inline constexpr const char* index_checksum = "hfdelta_index_checksum";
}  // namespace key

// The encoding of one tensor's entry.
Encoding encoding_of(const DeltaIndex& idx, const std::string& tensor);

// True if DIR is a delta version (its index has metadata.delta_encoding).
bool is_delta_dir(const boost::filesystem::path& dir);

// Reads DIR's index once: none if DIR is not a delta version (no index, or
// an index without any delta key: a full checkpoint), else the delta's index
// as read_delta_index reads it. Lets a caller that must tell a full version
// from a delta and then read the delta parse the index only once.
std::optional<DeltaIndex> read_index_if_delta(const boost::filesystem::path& dir);

// Reads and validates DIR/model.safetensors.index.json of a delta.
// Throws Error(bad_input) naming the file, Error(unsupported) for an encoding,
// compression, checksum format or hfdelta revision this build cannot apply.
DeltaIndex read_delta_index(const boost::filesystem::path& dir);

// Same, from the index text; `what` names it in errors.
DeltaIndex parse_delta_index(std::string_view text, const std::string& what);

}  // namespace hfdelta
