// delta-diff --withdraw: take a bad version back out of a publication root.
//
// A version that should never have been published (wrong weights, damaged
// or cut short on its way to the root) stops every host that pulls it. Its
// directory ROOT/weight_vNNNNNN is renamed to ROOT/withdrawn_vNNNNNN (one
// atomic step; the delta beside a full version, ROOT/delta_vNNNNNN, to
// ROOT/withdrawn_delta_vNNNNNN), so that:
// - hosts that never applied it no longer see it, and skip its number: the
//   next version is published on the newest version below it;
// - its number is never given again (ROOT's next version is past it), so a
//   host that did apply it is told so by its next pull, and takes a newer
//   full version where there is one (or is re-initialised by hand);
// - its bytes stay for inspection until a prune removes it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <boost/filesystem/path.hpp>
#include <nlohmann/json_fwd.hpp>

namespace hfdelta {

struct WithdrawResult {
  boost::filesystem::path root;
  std::uint64_t version = 0;
  boost::filesystem::path withdrawn;               // ROOT/withdrawn_vNNNNNN
  std::optional<boost::filesystem::path> sidecar;  // ROOT/withdrawn_delta_vNNNNNN, if there was one
  bool already = false;                            // withdrawn by an earlier run: nothing changed
  // Newer versions published on it: no delta path reaches them any more;
  // withdraw them too, or publish a full version.
  std::vector<std::uint64_t> stranded;
  // Publications of a newer version under way as it was withdrawn (their
  // hidden directories in ROOT): built on it, they are refused at their
  // commit, which checks the base again (root_commit.hpp).
  std::vector<boost::filesystem::path> in_flight;
  // The version the next one is published on (none: nothing left).
  std::optional<std::uint64_t> newest;
};

// Withdraws version directory `dir` (ROOT/weight_vNNNNNN) from its root,
// flushing ROOT if `sync`. Idempotent: a version withdrawn already is
// reported as such. Errors: Error(usage) for a path that is no version
// directory name, Error(bad_input) for one that is not there (and not
// withdrawn) or is a LOCAL, Error(failure) for an I/O error.
WithdrawResult withdraw_version(const boost::filesystem::path& dir, bool sync);

// The documented JSON form (man delta-diff, WITHDRAW OUTPUT).
nlohmann::json withdraw_json(const WithdrawResult& r);

}  // namespace hfdelta
