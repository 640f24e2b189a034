#include "hfdelta/peers.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

#include "hfdelta/error.hpp"
#include "hfdelta/host_report.hpp"
#include "hfdelta/signals.hpp"
#include "hfdelta/version.hpp"
#include "root/root_view.hpp"
#include "store/local_store.hpp"
#include "util/io.hpp"

namespace hfdelta {

using json = nlohmann::json;

namespace fs = boost::filesystem;

namespace {

// What a peer's report says against `version`: "" when it holds it.
std::string lack_of(const fs::path& dir, const std::string& peer, std::uint64_t version, double now) {
  const fs::path file = host_report_path(dir, peer);
  std::optional<HostReport> r;
  try {
    r = read_host_report(file);
  } catch (const Error& e) {
    return peer + ": its report cannot be read (" + e.what() + ")";
  }
  if (!r) return peer + ": no report " + file.string() + " (offline, or not pulling with --report-to)";
  if (r->version == version) return "";
  char age[64];
  std::snprintf(age, sizeof age, "report %.0f s old", std::max(0.0, now - r->time));
  std::string says = peer + ": holds " + (r->version ? format_version(*r->version) : std::string("no version")) + " (" +
                     age + (r->waiting_for_peers ? "" : ", exit " + std::to_string(r->exit_code)) + ")";
  if (r->version && *r->version > version)
    says += ", newer: a peer must hold exactly " + format_version(version) +
            " (peers pull with --follow, never past the node that reloads)";
  return says;
}

// One line per peer lacking `version`; empty when each holds it.
std::vector<std::string> lacking(const fs::path& dir, std::uint64_t version, const std::vector<std::string>& peers) {
  std::vector<std::string> out;
  const double now = unix_now();
  for (const std::string& p : peers)
    if (std::string l = lack_of(dir, p, version, now); !l.empty()) out.push_back(std::move(l));
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += (s.empty() ? "" : "; ") + l;
  return s;
}

const char* signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

}  // namespace

double wait_for_peers(const fs::path& dir, std::uint64_t version, const PeerWaitOptions& o) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const auto waited = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  std::vector<std::string> lack = lacking(dir, version, o.peers);
  if (!lack.empty() && o.waiting) o.waiting(joined(lack));
  while (!lack.empty()) {
    const std::string held =
        "; LOCAL holds " + format_version(version) + ", and --then was not run (the next run waits again)";
    if (const int sig = stop_signal())  // the version is committed: end the wait, not the pull
      fail(Exit::peers_unready, std::string("--peers: stopped by ") + signal_name(sig) + " after " +
                                    std::to_string(std::lround(waited())) + " s waiting for version " +
                                    format_version(version) + ": " + joined(lack) + held);
    if (waited() >= o.timeout) {
      char after[64];
      std::snprintf(after, sizeof after, "--peers: after %g s, ", o.timeout);
      fail(Exit::peers_unready, after + std::to_string(lack.size()) + " of " + std::to_string(o.peers.size()) +
                                    " peers do not hold version " + format_version(version) + ": " + joined(lack) +
                                    held);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(o.poll, std::max(0.0, o.timeout - waited()))));
    lack = lacking(dir, version, o.peers);
  }
  return waited();
}

FollowResult pull_following(const fs::path& root, const fs::path& local, const fs::path& dir, const std::string& leader,
                            const ApplyOptions& opts) {
  FollowResult f;
  const fs::path file = host_report_path(dir, leader);
  const std::optional<HostReport> lead = read_host_report(file);
  f.leader_version = lead ? lead->version : std::nullopt;
  check_local_path(local, Exit::out_of_order);
  const std::optional<std::uint64_t> held = read_state(local).version;
  if (f.leader_version && (!held || *held < *f.leader_version)) {
    f.result = pull(root, local, f.leader_version, opts);
    f.pulled = true;
    return f;
  }
  f.note = !lead               ? "following " + leader + ", which has no report yet (" + file.string() + ")"
           : !f.leader_version ? "following " + leader + ", which holds no version yet"
           : *held == *f.leader_version
               ? "at " + leader + "'s version " + format_version(*held)
               : "holds " + format_version(*held) + ", newer than " + leader + "'s " +
                     format_version(*f.leader_version) + "; it waits for " + leader + " to catch up";
  ApplyResult& r = f.result;
  r.from_version = held;
  r.to_version = held.value_or(0);
  r.noop = true;
  r.no_version = !held;
  const RootListing listing = list_root(root);
  r.published = listing.all.size();
  r.newest = listing.newest();
  return f;
}

nlohmann::json follow_json(const std::string& leader, const FollowResult& f) {
  return {{"host", leader},
          {"version", f.leader_version ? json(format_version(*f.leader_version)) : json()},
          {"pulled", f.pulled},
          {"note", f.note.empty() ? json() : json(f.note)}};
}

}  // namespace hfdelta
