#include "hfdelta/host_report.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"
#include "root/root_view.hpp"
#include "store/local_store.hpp"
#include "util/io.hpp"
#include "util/json_text.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using json = nlohmann::json;

namespace {

// A report is a few hundred bytes; an error message is its largest part.
constexpr JsonLimits kReportJson{1u << 20, 1'000};

std::string absolute_name(const fs::path& p) {
  boost::system::error_code ec;
  const fs::path a = fs::absolute(p, fs::current_path(ec));
  return (ec ? p : a).lexically_normal().string();
}

}  // namespace

json version_json(const std::optional<std::uint64_t>& v) { return v ? json(format_version(*v)) : json(); }

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

void check_reports_apart(const fs::path& dir, const fs::path& root, const std::string& option) {
  const Nesting n = nesting(dir, root);
  std::string where;
  if (n == Nesting::same)
    where = "is the publication root ";
  else if (n == Nesting::inside)
    where = "lies inside the publication root ";
  else if (nesting(root, dir) == Nesting::inside)  // hosts that write DIR could rename or remove ROOT
    where = "contains the publication root ";
  else
    return;
  fail(Exit::bad_input, dir,
       where + root.string() + ", which only the trainer writes; give " + option +
           " the directory the hosts write their reports to, apart from it (e.g. a sibling of "
           "ROOT)");
}

void check_reports_dir(const fs::path& dir, const fs::path& root) {
  check_reports_apart(dir, root, "--report-to");  // first: nothing is to be made inside ROOT
  require_dir(dir, "create the reports directory first (mkdir -p " + dir.string() + ")");
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
    r.newest = newest_published(t.root);
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

namespace {

// What is at `st`, when it is not a regular file.
std::string kind_of(const fs::path& file, const struct stat& st) {
  if (S_ISLNK(st.st_mode)) {
    boost::system::error_code ec;
    const fs::path to = fs::read_symlink(file, ec);
    return "a symlink" + (ec ? std::string() : " to " + to.string()) + ", which is not followed";
  }
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device";
  return "not a file";
}

// delta-apply --report-to writes a report as a regular file of its own (a
// temporary file renamed into place), never a link: anything else in DIR was
// put there by something else, and a link could lead anywhere (a FIFO, a
// device, another host's report standing in for this one).
[[noreturn]] void fail_not_regular(const fs::path& file, const struct stat& st) {
  fail(Exit::bad_input, file,
       "not a regular file: " + kind_of(file, st) +
           "; delta-apply --report-to writes each report as a regular file of its own, so something "
           "else put this here: remove it (the host's next pull writes its report)");
}

// The report's bytes, or none if there is none. lstat says what is there
// before anything is opened (opening a FIFO would wait for a writer); the
// open (O_NOFOLLOW, O_NONBLOCK) and its fstat check again, since the name may
// be replaced in between.
std::optional<std::string> read_report_text(const fs::path& file) {
  struct stat st {};
  if (::lstat(file.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT) return std::nullopt;
    fail(Exit::failure, file, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) fail_not_regular(file, st);
  const int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return std::nullopt;
    if (e == ELOOP && ::lstat(file.c_str(), &st) == 0) fail_not_regular(file, st);
    fail(Exit::failure, file, std::string("open: ") + std::strerror(e));
  }
  const struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    fail(Exit::failure, file, std::string("fstat: ") + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) fail_not_regular(file, st);
  if (std::uint64_t(st.st_size) > kReportJson.bytes)
    fail(Exit::bad_input, file,
         std::to_string(st.st_size) + " bytes, more than the " + std::to_string(kReportJson.bytes) +
             " a report may have");
  std::string text(std::size_t(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      fail(Exit::failure, file, std::string("read: ") + std::strerror(e));
    }
    if (n == 0) break;  // shortened meanwhile: the parser says what is missing
    got += std::size_t(n);
  }
  text.resize(got);
  return text;
}

}  // namespace

std::optional<HostReport> read_host_report(const fs::path& file) {
  const std::optional<std::string> text = read_report_text(file);
  if (!text) return std::nullopt;
  return parse_host_report(parse_json_text(*text, file.string(), "host report", kReportJson), file.string());
}

}  // namespace hfdelta
