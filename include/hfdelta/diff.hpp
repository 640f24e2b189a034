// delta-diff: compare two checkpoint directories and publish a delta version.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "hfdelta/encodings.hpp"

namespace hfdelta {

struct DiffOptions {
  // One encoding for every tensor (context by default: the smallest on
  // training steps, docs/performance.md), or none ("auto"):
  // context, or xor where that is smaller (recorded per tensor in the
  // index); of a tensor over 1 MiB the xor entry is compressed whole only
  // where a sample of its blocks says it may be smaller (delta-diff(1)).
  std::optional<Encoding> encoding = Encoding::context;
  int level = kDefaultLevel;  // zstd level: 1 to 19, or each frame kind's default (codec.hpp)
  std::uint64_t version = 0;
  std::uint64_t base_version = 0;
  int threads = 0;   // 0: all cores
  bool sync = true;  // flush the delta before publishing it
  // The publication root OUT is published into (empty: a delta outside any
  // root). Where it publishes version base_version, BASE must hold the bytes
  // that version records, checked before the delta is published
  // (Error(verify_failed)): a retried job or a stale BASE would publish a
  // version no host can apply.
  boost::filesystem::path root;
  // With `root`: OUT is the root's version `version` on `base_version`,
  // refused when it starts and again at its rename unless that base is the
  // root's newest version and the number is still free (root_commit.hpp).
  // publish_sidecar, which renames the delta a second time, checks itself.
  bool root_checks = true;
};

struct DiffSummary {
  std::uint64_t version = 0, base_version = 0;
  std::uint64_t tensors = 0, tensors_changed = 0;
  std::uint64_t elements = 0, elements_changed = 0;
  std::uint64_t tensor_bytes = 0;   // bytes of all tensors of NEW
  std::uint64_t bytes_changed = 0;  // bytes that differ
  std::uint64_t full_bytes = 0;     // size of every file of NEW
  std::uint64_t delta_bytes = 0;    // size of every file of the delta
  std::uint64_t files_changed = 0, files_removed = 0;
  EncodingCounts entries;  // entries per encoding
  void count_entry(Encoding e) { ++entries[e]; }
  // Structural changes: weight files built anew, whose header is rewritten in
  // place, removed; tensors without base bytes (new, or of another length).
  std::uint64_t shards_built = 0, shards_rewritten = 0, shards_removed = 0, tensors_new = 0;
  double seconds = 0;
};

// Writes OUT (which must not exist) atomically. Refuses (Error(bad_input))
// a BASE or NEW that is a delta version or has no weight files, and a BASE
// that is not the bytes of opts.root's version opts.base_version
// (Error(verify_failed)), and a publication whose base is not the root's
// newest version, or whose number was taken meanwhile (check_publishable).
// Throws Error.
DiffSummary diff_checkpoints(const boost::filesystem::path& base, const boost::filesystem::path& target,
                             const boost::filesystem::path& out, const DiffOptions& opts);

// Signs that BASE and NEW were not successive saves of one model (more than
// half of the elements changed, or a delta larger than NEW's weights): the
// delta is valid, but every host would fetch about a whole checkpoint. One
// sentence each; none for an ordinary step.
std::vector<std::string> diff_warnings(const DiffSummary& s);

}  // namespace hfdelta
