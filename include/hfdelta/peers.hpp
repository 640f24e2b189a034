// An engine across hosts (tensor or pipeline parallel over several nodes,
// each with its own LOCAL): the node that has the engine reload waits until
// every node holds its version, read from their host reports
// (host_report.hpp); the other nodes pull no further than that node's
// version, so that none moves on while the engine reloads
// (docs/engines.md, "An engine across hosts").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>
#include <nlohmann/json_fwd.hpp>

#include "hfdelta/apply.hpp"

namespace hfdelta {

struct PeerWaitOptions {
  std::vector<std::string> peers;  // their report names (DIR/NAME.json)
  double timeout = 300;            // seconds
  double poll = 0.5;               // seconds between two reads of the reports
  // Told once, before the first wait, which peers lack the version (for a
  // line on stderr); not called when every peer holds it already.
  std::function<void(const std::string&)> waiting;
};

// Waits until the report of every peer in DIR says it holds exactly
// `version` (a peer on another version would load other weights into the
// same engine). Returns the seconds waited. Error(peers_unready) after
// `timeout`, or at a stop signal, naming each peer that does not hold it and
// what its report says.
double wait_for_peers(const boost::filesystem::path& dir, std::uint64_t version, const PeerWaitOptions& o);

// A pull that goes no further than the version `leader`'s report in DIR
// says it holds: pull(root, local, that version, opts). Nothing is pulled
// (`pulled` false, `note` says why) while the leader has no report or no
// version, or LOCAL already holds that version or a newer one.
struct FollowResult {
  ApplyResult result;
  bool pulled = false;
  std::optional<std::uint64_t> leader_version;
  std::string note;
};
FollowResult pull_following(const boost::filesystem::path& root, const boost::filesystem::path& local,
                            const boost::filesystem::path& dir, const std::string& leader, const ApplyOptions& opts);

// --json's "follow" object: {"host", "version" (the leader's), "pulled", "note"}.
nlohmann::json follow_json(const std::string& leader, const FollowResult& f);

}  // namespace hfdelta
