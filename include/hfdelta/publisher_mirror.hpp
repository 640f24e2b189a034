// A publisher's mirror: the LOCAL that holds the version published last, the
// base of the next. MemoryPublisher holds one; so does each host leader of
// the sharded publisher (docs/sharded.md), whose ranks share it, each
// reading only its own regions. Opening takes the mirror's publisher lock
// (one publisher per mirror) and reconciles it with ROOT; a published
// version advances it through delta-apply's journalled, checked path. The
// rules of when the mirror must be reconciled again live here only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <boost/filesystem/path.hpp>

#include "hfdelta/apply.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/publisher.hpp"

namespace hfdelta {

class PublisherMirror {
 public:
  // Refuses paths swapped, nested or uninitialised (before the lock creates
  // anything in either; `form` names the call in errors), waits for the
  // lock, and reconciles the mirror with ROOT (errors say what to do).
  PublisherMirror(const boost::filesystem::path& root, const boost::filesystem::path& mirror,
                  const PublisherOptions& opts, const std::string& form);
  ~PublisherMirror();
  PublisherMirror(const PublisherMirror&) = delete;
  PublisherMirror& operator=(const PublisherMirror&) = delete;

  const boost::filesystem::path& root() const;
  const boost::filesystem::path& mirror() const;  // absolute
  const PublisherOptions& options() const;
  const PublisherOpening& opening() const;
  // The version published last (the mirror's once advanced).
  std::uint64_t version() const;
  // The mirror's version, reconciled with ROOT again first when the mirror
  // is not where this object left it (an advance that failed or never ran,
  // a process that changed it).
  std::uint64_t reconcile();
  // Version `v` is published; the mirror is behind it until advance() has run.
  void published(std::uint64_t v);
  // The XXH3-128 of the mirror's checksum record of its version (every
  // weight file's header and tensors, every other file): two hosts' mirrors
  // hold the same bytes exactly when these agree. Error(uninitialised)
  // without a record.
  Hash128 record_digest() const;
  // Applies ROOT's version `delta` (a directory) to the mirror. May run on
  // another thread while this one waits to join it (MemoryPublisher's
  // background advance): of what the other methods read, it writes only the
  // reconcile flag, and the version where it moves.
  ApplyResult advance(const boost::filesystem::path& delta);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace hfdelta
