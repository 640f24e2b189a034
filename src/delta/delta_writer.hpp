// Writing a delta version directory, for delta-diff and --squash alike: the
// delta files (entries grouped by the weight file they patch, by name), the
// headers and files it carries, and its index, in a temporary directory
// beside OUT that is then published as OUT.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "codec/codec.hpp"
#include "format/root_commit.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/hash.hpp"
#include "util/io.hpp"

namespace hfdelta {

// One entry of the delta, as its delta file and the index record it.
struct NewDeltaEntry {
  std::string name;    // the tensor
  std::string target;  // the weight file it patches ("" where not known)
  std::uint64_t size = 0;
  Hash128 new_hash;
  std::optional<Hash128> base_hash;  // none: no base bytes to check (a new tensor)
  Encoding encoding = Encoding::xor_bytes;
};

// Writes the bytes of entries[i] into `f` at `at`.
using EntryBody = std::function<void(std::size_t i, File& f, std::uint64_t at)>;

// OUT must not exist, and its parent must be a directory.
void check_delta_out(const boost::filesystem::path& out);

struct DeltaWriter {
  boost::filesystem::path out, tmp;
  bool sync = true;
  std::set<boost::filesystem::path> dirs;  // tmp and the subdirectories made in it, flushed before publication
  std::uint64_t total = 0;                 // bytes of the entries: the index's total_size
  PublishExpectation expect;               // OUT in a root: what its rename depends on (root_commit.hpp)

  // Makes the temporary directory beside `out`.
  DeltaWriter(const boost::filesystem::path& out, bool sync);
  // Removes the temporary directory unless the delta was published or
  // abandoned: a writer left on any path, an exception's included, leaves
  // nothing behind. Errors are ignored.
  ~DeltaWriter();
  DeltaWriter(const DeltaWriter&) = delete;
  DeltaWriter& operator=(const DeltaWriter&) = delete;

  // One delta file per target weight file; fills idx's weight_map, targets,
  // base_checksums and (per_tensor) encodings.
  void write_entries(DeltaIndex& idx, const std::vector<NewDeltaEntry>& entries, const EntryBody& body);
  // headers/<file>: given bytes, or a copy of `from`.
  void put_header(const std::string& file, std::string_view bytes);
  void copy_header(const std::string& file, const boost::filesystem::path& from);
  // files/<path>: a copy of `from`.
  void copy_file(const std::string& path, const boost::filesystem::path& from);
  // Writes the index and publishes the delta as OUT; returns its size.
  std::uint64_t publish(const DeltaIndex& idx);
  // Removes what was written (on failure).
  void abandon();

 private:
  bool done_ = false;  // published or abandoned: tmp is no longer the writer's to remove
  boost::filesystem::path place(const char* sub, const std::string& rel);
};

}  // namespace hfdelta
