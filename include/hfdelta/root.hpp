// What the front-ends ask of a publication root beyond pulling and
// publishing. The model every reader of a root asks is src/root/root_view.hpp.
#pragma once

#include <vector>

#include <boost/filesystem/path.hpp>

namespace hfdelta {

// The delta version directories FIRST, LAST and every version between them,
// found beside them (weight_vNNNNNN), oldest first; a withdrawn number
// is skipped (the next version is published on the one before it). Throws
// Error(bad_input) if one is missing.
std::vector<boost::filesystem::path> chain_between(const boost::filesystem::path& first,
                                                   const boost::filesystem::path& last);

}  // namespace hfdelta
