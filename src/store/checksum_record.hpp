// Checksums of a host-local checkpoint's recorded version.
//
// Every apply records, in LOCAL/.weight_sync/checksums/VERSION.json, the
// XXH3-128 of each weight file's header, of each of its tensors and of every
// other file, for the version it leaves LOCAL at. A delta step derives the
// record from the previous one and the checksums the delta carries (so it
// costs no extra read); --init hashes what it installed. verify_local()
// (verify.hpp) re-hashes LOCAL and compares.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <boost/filesystem/path.hpp>

#include "hfdelta/hash.hpp"

namespace hfdelta {

struct Checkpoint;

struct WeightRecord {
  std::uint64_t size = 0;
  Hash128 header;                          // the 8-byte length and the JSON header
  std::map<std::string, Hash128> tensors;  // by tensor name
  bool operator==(const WeightRecord&) const = default;
};

struct FileRecord {
  std::uint64_t size = 0;
  Hash128 hash;
  bool operator==(const FileRecord&) const = default;
};

struct ChecksumRecord {
  std::map<std::string, WeightRecord> weights;  // by path relative to LOCAL
  std::map<std::string, FileRecord> files;      // every other file
  bool operator==(const ChecksumRecord&) const = default;
};

// Hashes every file of the checkpoint directory `dir` (its state directory excluded).
ChecksumRecord compute_record(const boost::filesystem::path& dir, int threads);
// The same, for `c`, the checkpoint `dir` holds, opened already; adds the
// number of bytes hashed to `*bytes_hashed` if given.
ChecksumRecord compute_record(const boost::filesystem::path& dir, const Checkpoint& c, int threads,
                              std::uint64_t* bytes_hashed = nullptr);

boost::filesystem::path record_file(const boost::filesystem::path& local, std::uint64_t version);
std::optional<ChecksumRecord> read_record(const boost::filesystem::path& local, std::uint64_t version);
void write_record(const boost::filesystem::path& local, std::uint64_t version, const ChecksumRecord& r, bool sync);
// Removes the record of `version`, if any (a rolled back step's).
void remove_record(const boost::filesystem::path& local, std::uint64_t version);
// Removes the records of every version but `keep` (best effort).
void prune_records(const boost::filesystem::path& local, std::uint64_t keep);

}  // namespace hfdelta
