// Planning a delta's apply: what LOCAL holds is read first (survey_local),
// then plan_apply decides every write from that and the opened delta alone.
// plan_apply takes no path it could write through and no open file, so
// "nothing is written before the plan is complete" holds by construction;
// the plan is executed by execute_plan (apply_execute.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "codec/codec.hpp"
#include "delta/delta_reader.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/hash.hpp"
#include "store/checksum_record.hpp"
#include "store/journal.hpp"
#include "util/io.hpp"

namespace hfdelta {

// What the plan needs to know of LOCAL, read before planning.
struct LocalView {
  enum class Kind { none, regular, other };
  boost::filesystem::path dir;                      // for messages only
  std::uint64_t version = 0;                        // its recorded version, the delta's base
  Checkpoint checkpoint;                            // its weight files and headers
  std::map<std::string, Kind> named;                // every path the delta names: what LOCAL has there
  std::map<std::string, std::uint64_t> hard_links;  // weight files with more than one link
  Kind kind(const std::string& path) const;
};

// Reads what plan_apply needs of LOCAL for delta `d`, writing nothing.
// Refuses a LOCAL holding a symlink (nothing is patched, replaced or removed
// through a link) or whose weight files are invalid (Error(bad_input)).
LocalView survey_local(const boost::filesystem::path& local, std::uint64_t version, const OpenDelta& d);

// One entry to lay over a tensor: where, from which bytes, and the checksums
// to check before and after.
struct Patch {
  std::string tensor;
  std::span<const std::uint8_t> frame;  // view into the delta file's mapping
  std::string delta_file;               // its path, for messages (with which part, for a part)
  std::string delta_path;               // the delta file's path alone: the path of its errors
  Encoding encoding = Encoding::overwrite;
  Hash128 new_hash;
  std::optional<std::uint32_t> adler32;  // recorded instead of new_hash (an adler32 delta): see `computed`
  std::optional<Hash128> base_hash;
  std::uint32_t local_shard = 0;         // into Manifest::shards
  std::uint64_t offset = 0, nbytes = 0;  // absolute in the LOCAL shard (or in the built file)
  // A large sparse entry whose chunk ranges are patched by several threads:
  // its checksums are computed in passes of their own.
  bool split = false;
  std::uint64_t chunk_bytes = 0;
  // Header bytes rewritten in place (a "header" shard operation): the new
  // bytes, laid over [0, nbytes) of the file instead of a decoded entry.
  std::span<const std::uint8_t> replace;
  // A stacked entry's layers, laid in order, and its parts layers' heads (by
  // layer; null for the others).
  std::vector<StackLayer> layers;
  std::vector<std::shared_ptr<const PartsEntry>> layer_parts;
  // A parts entry's regions, laid over a copy of the tensor. Where the
  // entry's checksum is not the tensor's XXH3-128 (a parts entry, a stack
  // ending with one, an entry of an adler32 delta), the new bytes' checksum
  // (for the record, and the check after writing) is left in `computed`.
  std::shared_ptr<const PartsEntry> parts;
  std::shared_ptr<Hash128> computed;
  // The tensor's new bytes in a file of their own (a stacked entry already
  // laid over a copy), laid over LOCAL instead of a decoded entry.
  const File* source = nullptr;
  // Patched in the one-pass apply: LOCAL may already hold writes that a
  // failure rolls back. Otherwise a failure comes before LOCAL is written.
  bool live = false;
};

// A weight file built beside LOCAL (a "build" shard operation): its header,
// then each tensor copied from LOCAL's base bytes or left zero, and patched
// by its entry if it has one.
struct BuildTensor {
  std::string name;
  std::uint64_t dst = 0, nbytes = 0;                         // in the built file
  std::optional<std::pair<std::size_t, std::uint64_t>> src;  // LOCAL weight file (checkpoint order), absolute offset
  std::optional<std::size_t> entry;                          // into ApplyPlan::build_patches
  Hash128 hash;                                              // of its new bytes
};
struct Build {
  std::string file;
  std::uint64_t size = 0;
  std::span<const std::uint8_t> prefix;  // the new header bytes
  std::vector<BuildTensor> tensors;
  std::size_t mfile = 0;  // its put in the manifest
};

// A unit of parallel work: a whole entry, or chunks [c0, c1) of a split one.
struct PatchUnit {
  std::size_t patch = 0;
  std::uint64_t c0 = 0, c1 = 0;
  std::uint64_t bytes = 0;  // for scheduling, largest first
};

struct ApplyPlan {
  // Weight files that stay are patched in place (their journal index is
  // their slot in manifest.shards); the others are removed or rebuilt beside
  // LOCAL. manifest.files: the delta's file operations first (files[k] is
  // index.files[k], for staging), then builds, then removals.
  Manifest manifest;
  std::vector<Patch> patches;        // in place, header rewrites included
  std::vector<Patch> build_patches;  // entries of tensors of built files
  std::vector<Build> builds;
  std::vector<std::string> sources;  // LOCAL's weight files, which BuildTensor::src indexes
  std::vector<PatchUnit> units;      // `patches` cut into parallel work, largest first
  std::vector<std::size_t> split;    // patches cut into chunk ranges
  // Header rewrites in place, by file: (new name, old name) of each tensor
  // at the same range, for the checksum record.
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> renames;
  std::uint64_t tensors_patched = 0, delta_bytes = 0;
};

// Plans applying `d` to LOCAL as `lv` shows it, for `threads` workers.
// Refuses (Error(verify_failed)) a LOCAL that is not the delta's base and
// (Error(bad_input)) a weight file patched in place that is hard-linked
// elsewhere. Writes nothing: it has no way to.
ApplyPlan plan_apply(const OpenDelta& d, const LocalView& lv, int threads);

// The checksum record of the new version: the base version's record with
// the delta's checksums laid over it.
ChecksumRecord next_record(ChecksumRecord rec, const DeltaIndex& idx, const ApplyPlan& plan);

}  // namespace hfdelta
