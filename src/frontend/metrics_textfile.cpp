#include "hfdelta/metrics_textfile.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <boost/filesystem/operations.hpp>

#include "hfdelta/error.hpp"
#include "hfdelta/host_report.hpp"
#include "hfdelta/report_json.hpp"
#include "root/root_view.hpp"
#include "store/local_store.hpp"
#include "util/io.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

constexpr const char* kLastSuccess = "hfdelta_last_success_timestamp_seconds";

std::string number(std::uint64_t v) { return std::to_string(v); }

std::string number(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// One metric: its # HELP and # TYPE lines, then its samples.
struct Family {
  std::ostringstream& out;
  const std::string& label;  // local="...", escaped

  void gauge(const char* name, const char* help, const std::vector<std::pair<std::string, std::string>>& samples) {
    if (samples.empty()) return;
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " gauge\n";
    for (const auto& [extra, value] : samples)
      out << name << '{' << label << (extra.empty() ? "" : ",") << extra << "} " << value << '\n';
  }
  void gauge(const char* name, const char* help, const std::optional<std::string>& value) {
    if (value) gauge(name, help, {{"", *value}});
  }
};

template <class T>
std::optional<std::string> opt_number(const std::optional<T>& v) {
  return v ? std::optional<std::string>(number(*v)) : std::nullopt;
}

// The version LOCAL holds after a failed run, read without the lock (the
// state file is replaced whole, never written in place); none if unreadable.
std::optional<std::uint64_t> held_after_failure(const fs::path& local) {
  try {
    return read_state(local).version;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<std::uint64_t> behind_after_failure(const RunOutcome& run, std::optional<std::uint64_t> held) {
  if (!run.root || !held) return std::nullopt;
  try {
    const auto newest = view_root(*run.root, held, run.opts.require_marker).newest_complete();
    return newest ? *newest - *held : 0;
  } catch (const std::exception&) {  // ROOT unreadable: what made the run fail, most likely
    return std::nullopt;
  }
}

}  // namespace

std::string escape_label_value(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_metrics(const RunMetrics& m) {
  std::ostringstream out;
  const std::string label = "local=\"" + escape_label_value(m.local) + "\"";
  Family f{out, label};
  f.gauge("hfdelta_version_held", "The version LOCAL holds.", opt_number(m.version_held));
  f.gauge("hfdelta_versions_behind",
          "How many versions the newest complete version in ROOT is above the one LOCAL holds (pulls only).",
          opt_number(m.versions_behind));
  f.gauge(kLastSuccess, "Unix time the last run that exited 0 ended.",
          m.last_success ? std::optional<std::string>(number(*m.last_success, 3)) : std::nullopt);
  f.gauge("hfdelta_last_run_timestamp_seconds", "Unix time the last run ended.", number(m.run_time, 3));
  f.gauge("hfdelta_last_exit_code", "Exit code of the last run (0: success; see delta-apply(1)).",
          std::to_string(m.exit_code));
  f.gauge("hfdelta_last_run_versions_applied", "Versions the last run applied (a full version counts).",
          opt_number(m.versions_applied));
  f.gauge("hfdelta_last_run_delta_bytes", "Bytes of delta entries the last run read.", opt_number(m.delta_bytes));
  f.gauge("hfdelta_last_run_root_bytes", "Bytes of the version directories the last pull read from ROOT.",
          opt_number(m.root_bytes));
  if (m.phases) {
    const PhaseTimes& t = *m.phases;
    std::vector<std::pair<std::string, std::string>> s = {{"phase=\"lock\"", number(t.lock, 6)},
                                                          {"phase=\"read\"", number(t.read, 6)},
                                                          {"phase=\"patch\"", number(t.patch, 6)},
                                                          {"phase=\"sync\"", number(t.sync, 6)}};
    if (t.then) s.push_back({"phase=\"then\"", number(*t.then, 6)});
    f.gauge("hfdelta_last_run_phase_seconds",
            "Seconds the last run spent in each phase: lock, read, patch and sync come before --then (the engine "
            "serves the old weights), then is the --then command (the engine's reload).",
            s);
  }
  return out.str();
}

std::optional<double> read_last_success(const fs::path& file) {
  if (!exists_nofollow(file)) return std::nullopt;
  std::istringstream in(read_small_file(file, 1u << 20));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(kLastSuccess, 0) != 0) continue;
    const char next = line.size() > std::strlen(kLastSuccess) ? line[std::strlen(kLastSuccess)] : '\0';
    if (next != '{' && next != ' ') continue;
    const std::string value = line.substr(line.find_last_of(' ') + 1);
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (!value.empty() && *end == '\0') return v;
  }
  return std::nullopt;
}

std::string metrics_file_problem(const fs::path& file) {
  const fs::path dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  boost::system::error_code ec;
  if (!fs::is_directory(dir, ec))
    return file.string() + ": its directory " + dir.string() + " does not exist; create it first";
  if (fs::is_directory(file, ec)) return file.string() + ": is a directory; give the file to write";
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return file.string() + ": cannot write in " + dir.string() + ": " + std::strerror(errno);
  return "";
}

void write_metrics_textfile(const fs::path& file, const RunOutcome& run) {
  RunMetrics m;
  m.local = fs::absolute(run.local).lexically_normal().string();
  m.exit_code = run.exit_code;
  m.run_time = unix_now();
  if (run.exit_code == 0) {
    m.last_success = m.run_time;
  } else {
    try {
      m.last_success = read_last_success(file);
    } catch (const std::exception&) {  // unreadable: left out, the next success writes it
    }
  }
  if (const ApplyResult* r = run.result) {
    if (!r->no_version) m.version_held = r->to_version;
    if (run.root) m.versions_behind = behind_complete(*r), m.root_bytes = r->root_bytes;
    m.versions_applied = r->applied.size();
    m.delta_bytes = r->delta_bytes;
    m.phases = r->phases;
  } else {
    m.version_held = held_after_failure(run.local);
    m.versions_behind = behind_after_failure(run, m.version_held);
  }
  try {
    write_file_atomic(file, format_metrics(m), true);
  } catch (const Error& e) {
    throw Error(e.code(), "--metrics " + file.string() + ": not written: " + e.what(), file.string());
  }
}

}  // namespace hfdelta
