// Host state reports: `delta-apply --root ROOT LOCAL --report-to DIR` writes,
// after every pull, DIR/NAME.json saying what the host holds (docs/format.md,
// "Host reports"). DIR is shared by the hosts and lies apart from ROOT, which
// only the trainer writes. Read back by the fleet view (fleet.hpp) and by a
// node waiting for its peers (peers.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <boost/filesystem/path.hpp>
#include <nlohmann/json_fwd.hpp>

namespace hfdelta {

// The layout of a report (its "schema"): raised when a field changes
// meaning or goes away, not when one is added.
inline constexpr int kHostReportSchema = 1;

struct HostReport {
  std::string host;                      // NAME: the report is DIR/NAME.json
  std::string local, root;               // absolute, as the host names them
  std::optional<std::uint64_t> version;  // LOCAL's after the run; none: no version
  std::optional<std::uint64_t> newest;   // the newest version named in ROOT; none: none, or ROOT unreadable
  // Written by a node with --peers once it holds `version`, before it waits
  // for its peers: the run has no exit code yet.
  bool waiting_for_peers = false;
  int exit_code = 0;
  std::string error_kind, error;  // empty when exit_code is 0
  double time = 0;                // when it was written, seconds since the epoch
  std::string program_version;    // hfdelta's
};

// What a report names the run: the directory, the host, LOCAL and ROOT.
struct ReportTarget {
  boost::filesystem::path dir;
  std::string host;
  boost::filesystem::path local, root;
  std::string program_version;
};

// This machine's host name, the default NAME; Error(usage) if it is not a
// valid NAME (then --host is needed).
std::string default_host_name();

// NAME must be a plain file name of letters, digits, '.', '_' and '-', not
// starting with '.' (Error(usage), naming `option`).
void check_host_name(const std::string& name, const std::string& option);

// DIR/NAME.json.
boost::filesystem::path host_report_path(const boost::filesystem::path& dir, const std::string& host);

// Refuses (Error(bad_input), naming `option`) a reports directory that is
// ROOT, lies inside it or contains it: ROOT is writable only by the trainer;
// readers would meet the reports among its versions, and hosts that can
// write ROOT's parent can rename or remove ROOT. Used by --report-to and
// delta-fleet --reports alike, so the fleet view reads any DIR the hosts write.
void check_reports_apart(const boost::filesystem::path& dir, const boost::filesystem::path& root,
                         const std::string& option);
// --report-to DIR: check_reports_apart, then DIR must exist (Error(usage)).
void check_reports_dir(const boost::filesystem::path& dir, const boost::filesystem::path& root);

// The report of `t`'s host as things stand: LOCAL's recorded version (read
// without the lock: state.json is replaced atomically), ROOT's newest
// version by name, the time now; exit code 0. Never throws for LOCAL or ROOT:
// what cannot be read is left empty.
HostReport current_report(const ReportTarget& t);

nlohmann::json host_report_json(const HostReport& r);
// Parses a report; Error(bad_input) naming `what` if it breaks the layout.
HostReport parse_host_report(const nlohmann::json& j, const std::string& what);

// Writes DIR/NAME.json atomically: a temporary file in DIR, flushed,
// renamed over the old report, DIR flushed.
void write_host_report(const boost::filesystem::path& dir, const HostReport& r);

// Reads DIR/NAME.json: none if there is none; Error(bad_input) naming it if it
// is not a report, or not a regular file (a link, even to a report, a FIFO, a
// directory: a report is never written as one). Never blocks on a FIFO.
std::optional<HostReport> read_host_report(const boost::filesystem::path& file);

// "2025-06-01T12:00:00Z" for seconds since the epoch.
std::string iso_time(double unix_seconds);
// Seconds since the epoch, now.
double unix_now();
// A version as reports and --json name it ("000012"), or null.
nlohmann::json version_json(const std::optional<std::uint64_t>& v);

}  // namespace hfdelta
