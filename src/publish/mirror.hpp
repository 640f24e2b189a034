// A publisher's mirror: the checks made of ROOT and MIRROR before anything is
// created in either, and the reconciliation of the two when a publisher
// opens (an interrupted advance rolled back, a mirror behind ROOT caught up).
// Shared by MemoryPublisher and the sharded publisher's host leaders.
#pragma once

#include <cstdint>

#include <boost/filesystem/path.hpp>

#include "hfdelta/apply.hpp"
#include "hfdelta/publisher.hpp"

namespace hfdelta {

// How a mirror is advanced: delta-apply's path with the publisher's options.
ApplyOptions mirror_apply_options(const PublisherOptions& o);

// ROOT must be a publication root and MIRROR an initialised LOCAL, apart
// from each other (the arguments swapped, nested, or uninitialised are
// refused before the mirror's lock creates anything). `form` names the call
// in errors.
void check_mirror_paths(const boost::filesystem::path& root, const boost::filesystem::path& mirror,
                        const std::string& form);

// Brings the mirror and ROOT together (publisher.hpp, "Crash safety"):
// fills `opening`; errors say what to do.
void reconcile_mirror(const boost::filesystem::path& root, const boost::filesystem::path& mirror,
                      const PublisherOptions& opts, PublisherOpening& opening);

}  // namespace hfdelta
