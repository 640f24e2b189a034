#include "hfdelta/host_report.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/error.hpp"
#include "hfdelta/io.hpp"
#include "hfdelta/version.hpp"
#include "store/local_store.hpp"
#include "util/json_text.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using json = nlohmann::json;

namespace {

// A report is a few hundred bytes; an error message is its largest part.
constexpr JsonLimits kReportJson{1u << 20, 1'000};

json version_json(const std::optional<std::uint64_t>& v) { return v ? json(format_version(*v)) : json(); }

std::string absolute_name(const fs::path& p) {
  boost::system::error_code ec;
  const fs::path a = fs::absolute(p, fs::current_path(ec));
  return (ec ? p : a).lexically_normal().string();
}

}  // namespace

double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string iso_time(double unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(std::floor(unix_seconds));
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void check_host_name(const std::string& name, const std::string& option) {
  const bool ok =
      !name.empty() && name.size() <= 200 && name[0] != '.' &&
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == std::string::npos;
  if (!ok)
    fail(Exit::usage, option + ": \"" + name +
                          "\" is not a host name hfdelta takes: letters, digits, '.', '_' and '-', not starting "
                          "with '.' (it names the report file NAME.json)");
}

std::string default_host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0)
    fail(Exit::usage, "cannot read this machine's host name; give --host NAME");
  const std::string name = buf;
  check_host_name(name, "this machine's host name (give --host NAME instead)");
  return name;
}

fs::path host_report_path(const fs::path& dir, const std::string& host) { return dir / (host + ".json"); }

void check_reports_dir(const fs::path& dir, const fs::path& root) {
  const Nesting n = nesting(dir, root);  // first: nothing is to be made inside ROOT
  if (n == Nesting::apart)
    return require_dir(dir, "create the reports directory first (mkdir -p " + dir.string() + ")");
  fail(Exit::bad_input,
       dir.string() + (n == Nesting::same ? ": is the publication root " : ": lies inside the publication root ") +
           root.string() +
           ", which only the trainer writes; give --report a directory the hosts can write apart from "
           "it (e.g. a sibling of ROOT)");
}

HostReport current_report(const ReportTarget& t) {
  HostReport r;
  r.host = t.host;
  r.local = absolute_name(t.local);
  r.root = absolute_name(t.root);
  r.program_version = t.program_version;
  r.time = unix_now();
  try {
    r.version = read_state(t.local).version;
  } catch (const std::exception&) {  // a damaged state: the report says no version
  }
  try {
    const std::vector<VersionDir> all = scan_root(t.root);
    if (!all.empty()) r.newest = all.back().version;
  } catch (const std::exception&) {  // ROOT not mounted: the run's own error says so
  }
  return r;
}

json host_report_json(const HostReport& r) {
  json err;
  if (r.exit_code != 0 || !r.error.empty()) err = {{"kind", r.error_kind}, {"message", r.error}};
  json behind;
  if (r.version && r.newest) behind = *r.newest > *r.version ? *r.newest - *r.version : 0;
  return {{"schema", kHostReportSchema},
          {"host", r.host},
          {"local", r.local},
          {"root", r.root},
          {"version", version_json(r.version)},
          {"newest_version", version_json(r.newest)},
          {"behind", behind},
          {"state", r.waiting_for_peers ? "waiting_for_peers" : "done"},
          {"exit_code", r.waiting_for_peers ? json() : json(r.exit_code)},
          {"error", err},
          {"time", iso_time(r.time)},
          {"time_unix", std::round(r.time * 1000) / 1000},
          {"hfdelta_version", r.program_version}};
}

namespace {

std::optional<std::uint64_t> report_version(const json& j, const char* key, const std::string& what) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_string()) fail(Exit::bad_input, what + ": \"" + key + "\" must be a version string or null");
  return parse_version(j[key].get<std::string>(), what + ": \"" + key + "\"");
}

std::string report_string(const json& j, const char* key, const std::string& what) {
  if (!j.contains(key) || !j[key].is_string()) fail(Exit::bad_input, what + ": \"" + key + "\" must be a string");
  return j[key].get<std::string>();
}

}  // namespace

HostReport parse_host_report(const json& j, const std::string& what) {
  if (!j.is_object()) fail(Exit::bad_input, what + ": not a JSON object");
  if (!j.contains("schema") || !j["schema"].is_number_unsigned())
    fail(Exit::bad_input, what + ": no \"schema\": not a host report");
  if (j["schema"].get<std::uint64_t>() > static_cast<std::uint64_t>(kHostReportSchema))
    fail(Exit::unsupported, what + ": host report schema " + j["schema"].dump() + " is newer than this build's (" +
                                std::to_string(kHostReportSchema) + ")");
  HostReport r;
  r.host = report_string(j, "host", what);
  r.local = report_string(j, "local", what);
  r.root = report_string(j, "root", what);
  r.version = report_version(j, "version", what);
  r.newest = report_version(j, "newest_version", what);
  r.waiting_for_peers = report_string(j, "state", what) == "waiting_for_peers";
  if (!r.waiting_for_peers) {
    if (!j.contains("exit_code") || !j["exit_code"].is_number_integer())
      fail(Exit::bad_input, what + ": \"exit_code\" must be an integer");
    r.exit_code = j["exit_code"].get<int>();
  }
  if (j.contains("error") && j["error"].is_object()) {
    r.error_kind = report_string(j["error"], "kind", what + ": error");
    r.error = report_string(j["error"], "message", what + ": error");
  }
  if (!j.contains("time_unix") || !j["time_unix"].is_number())
    fail(Exit::bad_input, what + ": \"time_unix\" must be a number");
  r.time = j["time_unix"].get<double>();
  r.program_version = j.contains("hfdelta_version") && j["hfdelta_version"].is_string()
                          ? j["hfdelta_version"].get<std::string>()
                          : std::string();
  return r;
}

void write_host_report(const fs::path& dir, const HostReport& r) {
  write_file_atomic(host_report_path(dir, r.host), host_report_json(r).dump(2) + "\n", true);
}

std::optional<HostReport> read_host_report(const fs::path& file) {
  boost::system::error_code ec;
  if (!fs::exists(file, ec)) return std::nullopt;
  const std::string text = read_small_file(file, kReportJson.bytes);
  return parse_host_report(parse_json_text(text, file.string(), "host report", kReportJson), file.string());
}

}  // namespace hfdelta
