// A host's mirror, as the sharded publisher's host leader holds it
// (docs/sharded.md): the ranks of one host share one mirror, each reading
// only its own regions of it; the host's first rank opens it here, which
// takes the mirror's publisher lock (one publisher per mirror, as
// MemoryPublisher) and reconciles it with ROOT, and advances it once a
// version is published, through delta-apply's journalled, checked path.
#pragma once

#include <cstdint>
#include <memory>

#include <boost/filesystem/path.hpp>

#include "hfdelta/apply.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/publisher.hpp"

namespace hfdelta {

class ShardMirror {
 public:
  // The same checks and errors as MemoryPublisher's constructor (paths
  // swapped or nested, mirror uninitialised, lock timeout, ROOT and mirror
  // that cannot be reconciled).
  ShardMirror(const boost::filesystem::path& root, const boost::filesystem::path& mirror, const PublisherOptions& opts);
  ~ShardMirror();
  ShardMirror(const ShardMirror&) = delete;
  ShardMirror& operator=(const ShardMirror&) = delete;

  const PublisherOpening& opening() const;
  // The mirror's version, reconciled with ROOT again first when the mirror
  // is not where this object left it (an advance that failed, a process
  // that changed it).
  std::uint64_t reconcile();
  // The XXH3-128 of the mirror's checksum record of its version (every
  // weight file's header and tensors, every other file): two hosts' mirrors
  // hold the same bytes exactly when these agree. Error(uninitialised)
  // without a record.
  Hash128 record_digest() const;
  // Applies ROOT's version `delta` (a directory) to the mirror.
  ApplyResult advance(const boost::filesystem::path& delta);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace hfdelta
