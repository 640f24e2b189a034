// The fleet view (delta-fleet [--reports DIR] ROOT): every version of
// a publication root, and what each host reports holding. Reads ROOT and
// DIR only; writes nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>
#include <nlohmann/json_fwd.hpp>

#include "hfdelta/host_report.hpp"

namespace hfdelta {

// One version of ROOT.
struct FleetVersion {
  std::uint64_t version = 0;
  bool full = false;                  // an ordinary checkpoint, not a delta
  std::optional<std::uint64_t> base;  // a delta's base; a full version: the base of the delta beside it
  bool delta_beside = false;          // a full version with ROOT/delta_vNNNNNN
  std::uint64_t bytes = 0;            // its directory's files (its marker's sum where it has one)
  std::uint64_t delta_beside_bytes = 0;
  // Changed elements / elements, from the index's hfdelta_elements (a full
  // version: its delta beside's); none where it has none (--squash output,
  // deltas of older hfdelta releases).
  std::optional<double> density;
  double published = 0;  // seconds since the epoch: its marker's mtime, else its directory's
  bool marker = false;   // it has a completion marker
  enum class Status { complete, uploading, withdrawn, damaged } status = Status::complete;
  std::string note;  // uploading: what is not there yet; damaged: the error
};

// One host, from DIR/NAME.json.
struct FleetHost {
  std::string name;                  // NAME
  std::optional<HostReport> report;  // none: unreadable (`problem` says why)
  // Why the report cannot be read (a link, a FIFO, a directory, not a
  // report), or, with a report, why it cannot be trusted (dated in the
  // future: its host's clock runs ahead). Either counts as an alert.
  std::string problem;
  // Versions behind ROOT's newest complete version: version numbers between
  // the two, withdrawn ones not counted; none when the host has no version.
  std::optional<std::uint64_t> behind;
  bool holds_withdrawn = false;  // it holds a version since withdrawn
  double age = 0;                // seconds since the report was written
};

struct FleetView {
  std::string root, reports;  // reports: "" without --reports
  double now = 0;
  std::vector<FleetVersion> versions;  // ascending, withdrawn ones among them
  std::optional<std::uint64_t> newest, newest_complete;
  // Incomplete versions below a complete one: cut short (their publisher
  // died?); every pull stops below the first.
  std::vector<std::uint64_t> stalled;
  std::vector<FleetHost> hosts;  // by name
};

// Reads ROOT (and DIR's reports). `require_marker`: a version without a
// completion marker is still uploading, as a pull with --require-marker
// sees it (without: complete, as a plain pull takes it). Error(usage) if ROOT
// or DIR does not exist, Error(bad_input) if ROOT is no publication root.
FleetView fleet_view(const boost::filesystem::path& root, const std::optional<boost::filesystem::path>& reports,
                     bool require_marker);

// The --json object (without "schema" and "ok").
nlohmann::json fleet_json(const FleetView& v);

// The tables delta-fleet prints.
std::string fleet_text(const FleetView& v);

// Hosts past the thresholds (more than `max_behind` versions behind, no
// version, or a withdrawn one; a report older than `max_age` seconds; a
// report with a problem: one that cannot be read, or dated in the future,
// under either threshold), one line each; empty when none is.
std::vector<std::string> fleet_alerts(const FleetView& v, std::optional<std::uint64_t> max_behind,
                                      std::optional<double> max_age);

}  // namespace hfdelta
