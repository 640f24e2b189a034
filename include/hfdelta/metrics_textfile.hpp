// delta-apply --metrics FILE: the outcome of each run as a Prometheus
// textfile (node_exporter's textfile collector): gauges named hfdelta_*, each
// with # HELP and # TYPE, labelled with LOCAL's absolute path, written
// atomically (a temporary file beside FILE, flushed, renamed over it), also
// when the run fails.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/filesystem/path.hpp>

#include "hfdelta/apply.hpp"

namespace hfdelta {

// One run of delta-apply, as the metrics report it.
struct RunOutcome {
  boost::filesystem::path local;
  std::optional<boost::filesystem::path> root;  // a pull
  ApplyOptions opts;                            // for a pull's view of ROOT (require_marker)
  int exit_code = 0;
  const ApplyResult* result = nullptr;  // none: the run failed before it had one
};

// The samples of one metrics file; none leaves a metric out.
struct RunMetrics {
  std::string local;  // the label's value, unescaped
  int exit_code = 0;
  double run_time = 0;                 // unix time the run ended
  std::optional<double> last_success;  // unix time of the last run that exited 0
  std::optional<std::uint64_t> version_held, versions_behind, versions_applied, delta_bytes, root_bytes;
  std::optional<PhaseTimes> phases;
};

// `s` as a label value of the exposition format: \ " and newline escaped.
std::string escape_label_value(std::string_view s);

// The file's text: # HELP, # TYPE and the samples of each metric present.
std::string format_metrics(const RunMetrics& m);

// hfdelta_last_success_timestamp_seconds as an earlier file holds it (none:
// no file, or no such sample), so that a failed run keeps it.
std::optional<double> read_last_success(const boost::filesystem::path& file);

// What is wrong with FILE as a metrics file, checked before the run: its
// directory must exist and be writable, FILE must not be a directory. ""
// when fine.
std::string metrics_file_problem(const boost::filesystem::path& file);

// Gathers the metrics of `run` and writes them to FILE atomically. A run
// that failed: LOCAL's version read from its state file (unlocked), how far
// behind from ROOT as a pull sees it, the last success kept from FILE.
// Throws Error naming FILE when it cannot be written (no partial file left).
void write_metrics_textfile(const boost::filesystem::path& file, const RunOutcome& run);

}  // namespace hfdelta
